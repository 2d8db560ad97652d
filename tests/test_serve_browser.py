"""The explorer page in a real browser: the system's headless Chromium, driven by Playwright.

The page is loaded from a real server on 127.0.0.1; a sentence is typed in; the test waits for
the token table, the attention heatmap and the search results and checks what they show
against the models computed here, then the word-in-context table and plot.
"""
import numpy as np
import pytest
import torch

from serve_support import CHROMIUM, CHROMIUM_ARGS, review_sentences, sentence_index, trained_vocabulary

if not CHROMIUM.exists():
    pytest.skip(f"no Chromium at {CHROMIUM}: install it with `apt-get install chromium` (make install does, as root)",
                allow_module_level=True)
playwright_api = pytest.importorskip("playwright.sync_api", reason="Playwright is not installed: pip install playwright")
pytest.importorskip("uvicorn")

from bertforge.embeddings.embed import Embedder  # noqa: E402
from bertforge.serve.app import create_app  # noqa: E402
from bertforge.serve.background import serving  # noqa: E402
from bertforge.serve.models import load_models  # noqa: E402

SENTENCE = "The pills gave me a terrible headache and nausea."
TIMEOUT_MS = 60_000


@pytest.fixture(scope="module")
def served(minilm_dir, cassette_dir, data_dir, tmp_path_factory):
    sentences = review_sentences(data_dir, 120)
    vocab = trained_vocabulary(tmp_path_factory.mktemp("vocab") / "reviews-600", sentences)
    models = load_models(str(minilm_dir), mlm=str(cassette_dir), vocab=[str(vocab)],
                         index=sentence_index(minilm_dir, sentences))
    with serving(create_app(models)) as base:
        yield base, models


@pytest.fixture(scope="module")
def browser():
    with playwright_api.sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield browser
        browser.close()


def open_page(browser, base: str, width: int):
    page = browser.new_page(viewport={"width": width, "height": 1000})
    page.set_default_timeout(TIMEOUT_MS)
    page.problems = []  # console errors, uncaught exceptions, requests that leave the server
    page.on("console", lambda message: message.type == "error" and page.problems.append(message.text))
    page.on("pageerror", lambda error: page.problems.append(str(error)))
    page.on("request", lambda request: request.url.startswith(base) or page.problems.append(request.url))
    page.goto(base)
    page.wait_for_selector("body[data-ready=true]")  # the first sentence and word are shown
    return page


def explore(page, sentence: str) -> None:
    page.fill("#sentence", sentence)
    page.click("#explore")
    page.wait_for_selector(f'#attention-heatmap[data-text="{sentence}"]')
    page.wait_for_selector(f'#token-table[data-text="{sentence}"]')


@pytest.fixture(scope="module")
def page(served, browser):
    base, _ = served
    page = open_page(browser, base, 1280)
    explore(page, SENTENCE)
    page.wait_for_selector(f'#search-results[data-query="{SENTENCE}"] li')
    yield page
    page.close()


def attention_of(models, text: str) -> np.ndarray:
    encoder, tokenizer = models.embedding.embedder.model, models.embedding.tokenizer
    with torch.no_grad():
        output = encoder(**tokenizer(text, return_tensors="pt"), output_attentions=True)
    return np.round(torch.stack(output.attentions)[:, 0].numpy(), 4)  # as the server rounds them


def test_the_token_table_shows_each_vocabularys_pieces(page, served):
    _, models = served
    headers = page.locator("#token-table thead th").all_inner_texts()
    assert headers == ["#", *models.vocabularies]
    rows = [row.locator("td").all_inner_texts() for row in page.locator("#token-table tbody tr").all()]
    for column, (name, tokenizer) in enumerate(models.vocabularies.items(), start=1):
        shown = [row[column] for row in rows if row[column]]
        assert shown == tokenizer.tokenize(SENTENCE), name
    assert rows[0][0] == "1"


def test_the_heatmap_draws_the_chosen_layer_and_head(page, served):
    _, models = served
    attentions = attention_of(models, SENTENCE)
    size = attentions.shape[-1]
    encoded = models.embedding.tokenizer(SENTENCE)
    tokens = models.embedding.tokenizer.convert_ids_to_tokens(encoded["input_ids"])
    word_ids = np.array([-1 if w is None else w for w in encoded.word_ids()])
    # Links between two different words: not [CLS]/[SEP], not a piece to itself or to a piece of its own word.
    between = (word_ids[:, None] >= 0) & (word_ids[None, :] >= 0) & (word_ids[:, None] != word_ids[None, :])
    heatmap = page.locator("#attention-heatmap")
    assert int(heatmap.get_attribute("data-size")) == size
    for layer, head in ((0, 0), (2, 3), (5, 11)):
        page.select_option("#layer", str(layer))
        page.select_option("#head", str(head))
        matrix = attentions[layer, head]
        # The link named is the strongest between two words of the text (issue 24; before, "." -> "." could win).
        q, k = np.unravel_index(np.argmax(np.where(between, matrix, -1)), (size, size))
        assert word_ids[q] != word_ids[k]
        assert heatmap.get_attribute("data-strongest") == f"{q},{k}"
        summary = page.inner_text("#attention-summary")
        assert summary.startswith(f"Layer {layer + 1}, head {head + 1}") and f"{matrix[q, k]:.3f}" in summary
        assert f"“{tokens[q]}” → “{tokens[k]}”" in summary
        # The strongest cell of all is painted the darkest colour of the scale.
        peak = np.unravel_index(np.argmax(matrix), (size, size))
        assert heatmap.get_attribute("data-peak") == f"{peak[0]},{peak[1]}"
        pixel = page.evaluate("""([q, k]) => {
            const canvas = document.getElementById('attention-heatmap');
            const margin = Number(canvas.dataset.margin), cell = Number(canvas.dataset.cell);
            return Array.from(canvas.getContext('2d').getImageData(margin + k * cell + cell / 2,
                                                                   margin + q * cell + cell / 2, 1, 1).data);
        }""", [int(peak[0]), int(peak[1])])
        assert pixel == [23, 70, 160, 255]
    assert page.locator("#attention-grid canvas").count() == 6 * 12
    page.click("#attention-grid canvas[data-layer='1'][data-head='7']")
    assert page.input_value("#layer") == "1" and page.input_value("#head") == "7"
    assert page.inner_text("#attention-summary").startswith("Layer 2, head 8")


def hover_cell(page, q: int, k: int) -> None:
    box = page.locator("#attention-heatmap").bounding_box()
    margin, cell, width = page.evaluate("""() => { const c = document.getElementById('attention-heatmap');
        return [Number(c.dataset.margin), Number(c.dataset.cell), c.width]; }""")
    scale = box["width"] / width
    page.mouse.move(box["x"] + (margin + (k + 0.5) * cell) * scale, box["y"] + (margin + (q + 0.5) * cell) * scale)


def test_the_hover_label_follows_the_map_it_describes(page, served):
    _, models = served
    attentions = attention_of(models, SENTENCE)
    page.select_option("#layer", "0")
    page.select_option("#head", "0")
    hover_cell(page, 2, 3)
    assert page.inner_text("#attention-hover").endswith(f"{attentions[0, 0, 2, 3]:.3f}")
    page.select_option("#head", "1")  # another map under the same pointer: the old value must go
    assert page.inner_text("#attention-hover") == ""
    hover_cell(page, 2, 3)
    assert page.inner_text("#attention-hover").endswith(f"{attentions[0, 1, 2, 3]:.3f}")
    page.mouse.move(0, 0)
    assert page.inner_text("#attention-hover") == ""


def test_differing_pieces_are_marked_by_token_not_by_row(page, served):
    _, models = served
    first, *others = models.vocabularies.values()

    def pieces(tokenizer):
        encoded = tokenizer(SENTENCE, add_special_tokens=False, return_offsets_mapping=True)
        return [(start, stop, text) for text, (start, stop) in
                zip(tokenizer.convert_ids_to_tokens(encoded["input_ids"]), encoded["offset_mapping"])]

    reference = set(pieces(first))
    rows = page.locator("#token-table tbody tr").all()
    marked = [[cell.get_attribute("class") == "differs" for cell in row.locator("td").all()[1:]] for row in rows]
    shifted = 0
    for column, tokenizer in enumerate(others, start=1):
        own = pieces(tokenizer)
        for row, piece in enumerate(own):
            assert marked[row][column] == (piece not in reference), (column, row, piece)
            shifted += piece in reference and row < len(pieces(first)) and pieces(first)[row] != piece
    assert shifted > 0  # the sentence does shift rows: marking by row position would mark these


def test_search_results_are_the_index_top_five_with_scores(page, served):
    _, models = served
    expected = models.index.search([SENTENCE], 5)[0]
    items = page.locator("#search-results li")
    assert items.count() == 5
    for item, hit in zip(items.all(), expected):
        assert item.locator(".text").inner_text() == hit.text
        assert item.locator(".score").inner_text() == f"{hit.score:.3f}"
        assert item.get_attribute("data-id") == str(hit.id)


def test_the_search_weights_start_at_the_index_and_rerank_as_it_does(page, served):
    """The explorer's weights are the index's (GET /info); a changed one searches again as Index.search ranks."""
    _, models = served
    assert [page.input_value(f"#{name}-weight") for name in ("dense", "sentence", "neighbour")] == ["1", "0", "0"]
    assert page.locator("#sentence-weight").is_disabled()  # no sentence vectors in this index: the server says 422
    try:
        page.fill("#dense-weight", "0.6")
        page.dispatch_event("#dense-weight", "change")
        page.wait_for_selector('#search-results[data-weights="0.6,0,0"] li')
        expected = models.index.search([SENTENCE], 5, dense_weight=0.6)[0]
        assert expected != models.index.search([SENTENCE], 5)[0]  # BM25 does move this query's ranking
        items = page.locator("#search-results li")
        assert [item.get_attribute("data-id") for item in items.all()] == [str(hit.id) for hit in expected]
        assert [item.locator(".score").inner_text() for item in items.all()] == [f"{h.score:.3f}" for h in expected]
    finally:  # the page is the module's: the other tests read the index's own ranking
        page.fill("#dense-weight", "1")
        page.dispatch_event("#dense-weight", "change")
        page.wait_for_selector('#search-results[data-weights="1,0,0"] li')


def test_word_in_context_table_and_plot(page, served, minilm_dir):
    _, models = served
    page.wait_for_selector("#cosine-table[data-word=bank]")
    sentences = [line.strip() for line in page.input_value("#contexts").splitlines() if line.strip()]
    embedder = Embedder.from_pretrained(minilm_dir, layers="last_four_mean")
    vectors = np.stack([embedder.word_vector(s, "bank") for s in sentences])
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    shown = [row.locator("td").all_inner_texts() for row in page.locator("#cosine-table tbody tr").all()]
    assert shown == [[f"{value:.3f}" for value in row] for row in unit @ unit.T]
    assert page.locator("#pca-plot circle").count() == len(sentences)
    # Each point's title is its sentence with the occurrence in [brackets]; its label the sentence's number.
    assert page.locator("#pca-plot g.point title").all_text_contents() == [s.replace("bank", "[bank]", 1)
                                                                          for s in sentences]
    assert page.locator("#pca-plot g.point text").all_text_contents() == [str(i + 1) for i in range(len(sentences))]


def test_a_word_twice_in_a_sentence_is_two_points(page):
    page.fill("#word", "bank")
    page.fill("#contexts", "The bank by the river bank was closed.\nThe bank raised its rates.")
    page.click("#compare")
    page.wait_for_function("document.querySelectorAll('#pca-plot circle').length === 3")
    assert page.locator("#cosine-table thead th").all_inner_texts() == ["bank", "1.1", "1.2", "2"]
    assert page.locator("#pca-plot g.point title").all_text_contents()[1] == "The bank by the river [bank] was closed."


def test_a_screenshot_and_no_errors_or_outside_requests(page, tmp_path):
    assert page.problems == []  # before the next test, whose 422 the browser logs as an error
    shot = tmp_path / "explorer.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 20_000


def test_a_bad_word_shows_the_servers_message(page):
    page.fill("#word", "zebra")
    page.click("#compare")
    page.wait_for_selector("#error:not([hidden])")
    assert "'zebra' is not in the sentence" in page.inner_text("#error")
    page.fill("#word", "bank")
    page.click("#compare")
    page.wait_for_selector("#error[hidden]", state="attached")


def test_a_failed_view_is_emptied_and_an_empty_sentence_is_not_sent(served, browser):
    base, _ = served
    page = open_page(browser, base, 1280)
    try:
        page.route("**/search", lambda route: route.fulfill(status=424, content_type="application/json",
                                                             body='{"error": "the index is away", "error_type": "x"}'))
        explore(page, "A second sentence about headaches.")
        page.wait_for_selector("#error:not([hidden])")
        assert "the index is away" in page.inner_text("#error")
        assert page.locator("#search-results li").count() == 0  # not the first sentence's hits
        sent = []
        page.on("request", lambda request: sent.append(request.url))
        page.fill("#sentence", "   ")
        page.click("#explore")
        page.wait_for_function("document.getElementById('error').textContent.includes('Type a sentence')")
        assert not any(url.endswith(("/search", "/tokenize", "/explorer/attention")) for url in sent)
        assert page.locator("#token-table tr").count() == 0 and page.inner_text("#attention-summary") == ""
    finally:
        page.close()


def test_fill_mask_widget_shows_the_servers_top_five(page, served):
    import httpx

    base, _ = served
    text = page.input_value("#masked")
    page.wait_for_selector(f'#fill-results[data-text="{text}"] li')
    expected = httpx.post(f"{base}/fill-mask", json={"inputs": text, "top_k": 5}, timeout=60).json()
    shown = page.locator("#fill-results li").first.locator(".candidate")
    assert shown.locator(".token").all_inner_texts() == [c["token_str"] for c in expected[0]]
    assert shown.locator(".score").all_inner_texts() == [f"{c['score']:.3f}" for c in expected[0]]


@pytest.mark.parametrize("width", [420, 1280])
def test_a_long_text_fits_the_page_at_phone_and_desktop_widths(served, browser, width):
    base, _ = served
    page = open_page(browser, base, width)
    try:
        long_text = " ".join(["the pills gave me a terrible headache"] * 12)  # > 64 tokens: the heatmap's most
        explore(page, long_text)
        assert page.evaluate("document.documentElement.scrollWidth") <= width
        heatmap = page.locator("#attention-heatmap").bounding_box()
        section = page.locator("#attention-section").bounding_box()
        assert heatmap["x"] + heatmap["width"] <= section["x"] + section["width"]
        assert int(page.get_attribute("#attention-heatmap", "data-size")) == 64
    finally:
        page.close()
