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
def page(served):
    base, _ = served
    with playwright_api.sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.set_default_timeout(TIMEOUT_MS)
        page.problems = []  # console errors, uncaught exceptions, requests that leave the server
        page.on("console", lambda message: message.type == "error" and page.problems.append(message.text))
        page.on("pageerror", lambda error: page.problems.append(str(error)))
        page.on("request", lambda request: request.url.startswith(base) or page.problems.append(request.url))
        page.goto(base)
        page.wait_for_selector("body[data-ready=true]")  # the first sentence and word are shown
        page.fill("#sentence", SENTENCE)
        page.click("#explore")
        page.wait_for_selector(f'#attention-heatmap[data-text="{SENTENCE}"]')
        page.wait_for_selector(f'#search-results[data-query="{SENTENCE}"] li')
        page.wait_for_selector(f'#token-table[data-text="{SENTENCE}"]')
        yield page
        browser.close()


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
    heatmap = page.locator("#attention-heatmap")
    assert int(heatmap.get_attribute("data-size")) == size
    for layer, head in ((0, 0), (2, 3), (5, 11)):
        page.select_option("#layer", str(layer))
        page.select_option("#head", str(head))
        q, k = np.unravel_index(np.argmax(attentions[layer, head]), (size, size))
        assert heatmap.get_attribute("data-strongest") == f"{q},{k}"
        summary = page.inner_text("#attention-summary")
        assert summary.startswith(f"Layer {layer + 1}, head {head + 1}") and f"{attentions[layer, head, q, k]:.3f}" in summary
        # The strongest cell is painted the darkest colour of the scale.
        pixel = page.evaluate("""([q, k]) => {
            const canvas = document.getElementById('attention-heatmap');
            const margin = Number(canvas.dataset.margin), cell = Number(canvas.dataset.cell);
            return Array.from(canvas.getContext('2d').getImageData(margin + k * cell + cell / 2,
                                                                   margin + q * cell + cell / 2, 1, 1).data);
        }""", [int(q), int(k)])
        assert pixel == [23, 70, 160, 255]
    assert page.locator("#attention-grid canvas").count() == 6 * 12
    page.click("#attention-grid canvas[data-layer='1'][data-head='7']")
    assert page.input_value("#layer") == "1" and page.input_value("#head") == "7"
    assert page.inner_text("#attention-summary").startswith("Layer 2, head 8")


def test_search_results_are_the_index_top_five_with_scores(page, served):
    _, models = served
    expected = models.index.search([SENTENCE], 5)[0]
    items = page.locator("#search-results li")
    assert items.count() == 5
    for item, hit in zip(items.all(), expected):
        assert item.locator(".text").inner_text() == hit.text
        assert item.locator(".score").inner_text() == f"{hit.score:.3f}"
        assert item.get_attribute("data-id") == str(hit.id)


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
    assert page.locator("#pca-plot g.point title").all_text_contents() == sentences


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
