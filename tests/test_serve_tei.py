"""text-embeddings-inference's routes, with TEI's request and response shapes, against the peers:
sentence-transformers (vectors, token vectors, similarity, SPLADE, cross-encoder) and transformers."""
import numpy as np
import pytest
import torch

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from bertforge import BertConfig, BertForSequenceClassification, BertTokenizer  # noqa: E402
from bertforge.serve.app import create_app  # noqa: E402
from bertforge.serve.models import load_models  # noqa: E402
from bertforge.serve.settings import ServeSettings  # noqa: E402
from serve_support import tiny_classifier, sbert  # noqa: E402,F401 (sbert: a fixture)

TEXTS = ["The patient was admitted with severe chest pain.", "It worked well for my migraines.",
         "Side effects: nausea, dizziness and a dry mouth.", "ok"]
LONG = " ".join(["headache"] * 300)  # 302 tokens; MiniLM's folder says 256


def tiny_reranker(folder, vocab_from, seed: int = 1):
    """A random-weight one-label BertForSequenceClassification: a cross-encoder's shape."""
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=37, id2label={0: "LABEL_0"})
    BertForSequenceClassification(config).save_pretrained(folder, tokenizer=BertTokenizer.from_pretrained(vocab_from))
    return folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory, minilm_dir):
    root = tmp_path_factory.mktemp("tei")
    return {"classifier": tiny_classifier(root / "sentiment", minilm_dir),
            "reranker": tiny_reranker(root / "reranker", minilm_dir)}


@pytest.fixture(scope="module")
def models(minilm_dir, cassette_dir, folders):
    return load_models(str(minilm_dir), mlm=str(cassette_dir), classifier=str(folders["classifier"]),
                       reranker=str(folders["reranker"]))


@pytest.fixture(scope="module")
def client(models):
    with TestClient(create_app(models)) as client:
        yield client


def cosines(a, b) -> np.ndarray:
    a, b = np.asarray(a), np.asarray(b)
    return (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


def test_embed_with_a_prompt_equals_sentence_transformers(models, sbert):
    with TestClient(create_app(models, ServeSettings(default_prompt="query: "))) as client:
        vectors = client.post("/embed", json={"inputs": TEXTS}).json()
        assert client.get("/info").json()["default_prompt"] == "query: "
        unknown = client.post("/embed", json={"inputs": TEXTS, "prompt_name": "passage"})
    assert cosines(vectors, sbert.encode(TEXTS, prompt="query: ")).min() >= 0.9999
    assert unknown.status_code == 422 and "passage" in unknown.json()["error"]


def test_auto_truncate_and_the_422_that_names_it(models, sbert):
    with TestClient(create_app(models, ServeSettings(auto_truncate=True))) as client:
        cut = client.post("/embed", json={"inputs": LONG}).json()
        refused = client.post("/embed", json={"inputs": LONG, "truncate": False})
    assert cosines(cut[0], sbert.encode(LONG)) >= 0.9999
    assert refused.status_code == 422 and "--auto-truncate" in refused.json()["error"]


def test_truncation_direction_left_keeps_the_end(client, sbert):
    ids = sbert.tokenizer(LONG + " nausea", add_special_tokens=False)["input_ids"]
    left = client.post("/embed", json={"inputs": LONG + " nausea", "truncate": True,
                                       "truncation_direction": "Left"}).json()
    kept = client.post("/embed", json={"inputs": [ids[-254:]]}).json()  # [CLS] + the last 254 + [SEP]
    np.testing.assert_allclose(left, kept, atol=1e-6)


def test_embed_all_equals_sentence_transformers_token_embeddings(client, sbert):
    answer = client.post("/embed_all", json={"inputs": TEXTS[:2]}).json()
    expected = sbert.encode(TEXTS[:2], output_value="token_embeddings")
    for served, tokens in zip(answer, expected):
        assert np.array(served).shape == tuple(tokens.shape)  # [CLS] and [SEP] included
        assert cosines(served, tokens.numpy()).min() >= 0.999


def test_embed_sparse_equals_sentence_transformers_splade(client, cassette_dir):
    from sentence_transformers.sparse_encoder import SparseEncoder
    from sentence_transformers.sparse_encoder.modules import MLMTransformer, SpladePooling

    splade = SparseEncoder(modules=[MLMTransformer(str(cassette_dir)), SpladePooling("max")], device="cpu")
    expected = splade.encode(TEXTS[:2], convert_to_tensor=True).to_dense().numpy()
    answer = client.post("/embed_sparse", json={"inputs": TEXTS[:2]}).json()
    for served, dense in zip(answer, expected):
        assert [v["index"] for v in served] == np.flatnonzero(dense).tolist()
        np.testing.assert_allclose([v["value"] for v in served], dense[dense != 0], rtol=1e-4, atol=1e-5)


def test_similarity_equals_sentence_transformers(client, sbert):
    answer = client.post("/similarity", json={"inputs": {"source_sentence": TEXTS[0], "sentences": TEXTS[1:]}}).json()
    vectors = sbert.encode(TEXTS)
    np.testing.assert_allclose(answer, sbert.similarity(vectors[:1], vectors[1:])[0].numpy(), atol=1e-4)
    empty = client.post("/similarity", json={"inputs": {"source_sentence": "x", "sentences": []}})
    assert empty.status_code == 400


def test_decode_equals_transformers(client, minilm_dir):
    from transformers import BertTokenizerFast

    reference = BertTokenizerFast.from_pretrained(str(minilm_dir))
    ids = [reference(text)["input_ids"] for text in [*TEXTS[:2], "I don't know, it's fine!"]]  # "don ' t", as TEI
    assert client.post("/decode", json={"ids": ids}).json() == reference.batch_decode(ids, skip_special_tokens=True)
    kept = client.post("/decode", json={"ids": ids[0], "skip_special_tokens": False}).json()
    assert kept == [reference.decode(ids[0])]
    assert client.post("/decode", json={"ids": [5, 10**7]}).status_code == 422


def test_rerank_equals_the_cross_encoder(client, folders):
    from sentence_transformers import CrossEncoder

    query = "what helps a migraine?"
    expected = CrossEncoder(str(folders["reranker"]), device="cpu").predict([(query, t) for t in TEXTS])
    answer = client.post("/rerank", json={"query": query, "texts": TEXTS, "return_text": True}).json()
    assert [r["index"] for r in answer] == np.argsort(-expected, kind="stable").tolist()
    np.testing.assert_allclose([r["score"] for r in answer], np.sort(expected)[::-1], atol=1e-5)
    assert all(r["text"] == TEXTS[r["index"]] for r in answer)
    raw = client.post("/rerank", json={"query": query, "texts": TEXTS[:1], "raw_scores": True}).json()
    assert raw[0]["score"] == pytest.approx(float(np.log(expected[0] / (1 - expected[0]))), abs=1e-4)
    assert set(raw[0]) == {"index", "score"}  # text only when asked, as TEI


def test_a_pair_is_cut_from_the_end_the_request_names(client, folders):
    """truncation_direction was ignored for pairs (/rerank, /predict): "left" gave the right-cut score. TEI passes it
    to the tokenizer, which cuts the longer text from that end."""
    from transformers import BertTokenizerFast

    from bertforge import BertTokenizer

    query, text = "which animal", "zebra " * 700 + "apple " * 700
    reference = BertTokenizerFast.from_pretrained(str(folders["reranker"]))
    ours = BertTokenizer.from_pretrained(folders["reranker"])
    reference.truncation_side = ours.truncation_side = "left"
    expected = reference(query, text, truncation="longest_first", max_length=512)["input_ids"]
    assert ours(query, text, truncation="longest_first", max_length=512)["input_ids"] == expected
    kept = reference.decode(expected[expected.index(reference.sep_token_id) + 1:], skip_special_tokens=True)
    scores = {direction: client.post("/rerank", json={"query": query, "texts": [text], "truncate": True,
                                                      "truncation_direction": direction}).json()[0]["score"]
              for direction in ("left", "right")}
    cut_left = client.post("/rerank", json={"query": query, "texts": [kept]}).json()[0]["score"]
    assert scores["left"] == pytest.approx(cut_left, abs=1e-6) and scores["left"] != scores["right"]


def test_rerank_scores_a_pair_unless_both_its_texts_are_empty(client, folders):
    """TEI and CrossEncoder score (query, "") (a RAG chunk stripped to nothing); the server refused the whole call."""
    from sentence_transformers import CrossEncoder

    query, texts = "what helps a migraine?", [TEXTS[0], "", TEXTS[1]]
    expected = CrossEncoder(str(folders["reranker"]), device="cpu").predict([(query, t) for t in texts])
    answer = client.post("/rerank", json={"query": query, "texts": texts}).json()
    np.testing.assert_allclose(sorted(r["score"] for r in answer), np.sort(expected), atol=1e-5)
    empty_query = client.post("/rerank", json={"query": "", "texts": TEXTS[:2]})
    assert empty_query.status_code == 200 and len(empty_query.json()) == 2
    both = client.post("/rerank", json={"query": "", "texts": [TEXTS[0], ""]})
    assert both.status_code == 400 and "text 1 are both empty" in both.json()["error"]


def test_predict_takes_texts_pairs_and_batches_as_tei(client, folders):
    from transformers import AutoModelForSequenceClassification, BertTokenizerFast

    reference = AutoModelForSequenceClassification.from_pretrained(str(folders["classifier"])).eval()
    tokenizer = BertTokenizerFast.from_pretrained(str(folders["classifier"]))

    def expected(*texts):
        with torch.no_grad():
            return reference(**tokenizer(*texts, return_tensors="pt")).logits.softmax(-1)[0].numpy()

    labels = ["negative", "neutral", "positive"]
    one = client.post("/predict", json={"inputs": TEXTS[0]}).json()
    pair = client.post("/predict", json={"inputs": TEXTS[:2]}).json()  # [text, text] is one pair
    batch = client.post("/predict", json={"inputs": [[TEXTS[0]], TEXTS[:2]]}).json()
    for answer, probabilities in ((one, expected(TEXTS[0])), (pair, expected(TEXTS[0], TEXTS[1])),
                                  (batch[0], expected(TEXTS[0])), (batch[1], expected(TEXTS[0], TEXTS[1]))):
        assert {p["label"]: p["score"] for p in answer} == pytest.approx(dict(zip(labels, probabilities)), abs=1e-5)
        assert [p["score"] for p in answer] == sorted((p["score"] for p in answer), reverse=True)
    assert client.post("/predict", json={"inputs": TEXTS[:3]}).status_code == 422


def test_post_root_is_embed_as_tei_routes_it(client, sbert):
    answer = client.post("/", json={"inputs": TEXTS[:2]}).json()
    assert cosines(answer, sbert.encode(TEXTS[:2])).min() >= 0.9999
    assert "explorer.js" in client.get("/").text  # GET / is still the page


def test_features_not_loaded_say_how_to_load_them(minilm_dir):
    with TestClient(create_app(load_models(str(minilm_dir)))) as client:
        for path, body, words in (("/rerank", {"query": "q", "texts": ["t"]}, "--reranker"),
                                  ("/embed_sparse", {"inputs": "t"}, "--mlm"),
                                  ("/predict", {"inputs": "t"}, "--classifier")):
            response = client.post(path, json=body)
            assert response.status_code == 424 and words in response.json()["error"], path


def test_a_pickled_checkpoint_is_refused_in_one_line(tmp_path, minilm_dir):
    import shutil

    folder = tmp_path / "planted"
    shutil.copytree(minilm_dir, folder, ignore=shutil.ignore_patterns("*.safetensors", "*.bin"))

    class Payload:
        def __reduce__(self):
            return (print, ("this should never run",))

    torch.save({"embeddings.word_embeddings.weight": Payload()}, folder / "pytorch_model.bin")
    with pytest.raises(ValueError) as refused:
        load_models(str(folder))
    message = str(refused.value)
    assert "\n" not in message and "--model" in message and "pytorch_model.bin" in message


def test_threads_default_to_the_usable_physical_cores(client, models):
    from bertforge.engine.threads import default_threads

    assert client.get("/info").json()["threads"] == default_threads()
    # torch's count is per thread once a thread has run torch, and other tests (or pytest-xdist's share per
    # worker) change it in this one: what counts is the count on the thread the models run on.
    before = torch.get_num_threads()
    torch.set_num_threads(default_threads() + 1)
    try:
        app = create_app(models)
        with TestClient(app):
            assert app.state.server.executor.submit(torch.get_num_threads).result() == default_threads()
    finally:
        torch.set_num_threads(before)  # the next test on this worker must not run with one thread too many
    with pytest.raises(ValueError, match="threads"):
        create_app(models, ServeSettings(threads=0))


def test_without_threads_given_the_count_is_chosen_per_batch(models, monkeypatch):
    from bertforge.engine.threads import usable_threads

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = torch.get_num_threads()
    try:
        app = create_app(models)
        with TestClient(app) as client:
            governor = app.state.server.governor
            assert governor is not None and governor.counts[-1] == usable_threads()
            assert client.get("/info").json()["threads_chosen_per_batch"] is True
            for i in range(4):
                response = client.post("/embed", json={"inputs": [f"request {i} about ships"] * (i + 1)})
                assert response.status_code == 200
            assert governor.warmed_up and governor.cost  # the batches were timed by the governor
            assert app.state.server.executor.submit(torch.get_num_threads).result() in governor.counts
    finally:
        torch.set_num_threads(before)
    app = create_app(models, ServeSettings(threads=1))  # --threads: the user's count, kept
    assert app.state.server.governor is None
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert create_app(models).state.server.governor is None
    monkeypatch.delenv("OMP_NUM_THREADS")
    monkeypatch.setattr(models.embedding.embedder, "device", torch.device("cuda"))  # as a GPU server sees it
    assert create_app(models).state.server.governor is None  # a batch there does not wait on the CPU's threads


@pytest.fixture(scope="module")
def cls_prompted_dir(tmp_path_factory, minilm_dir):
    """MiniLM re-declared as a CLS-pooled, normalised ST folder with prompts (BGE / E5 style)."""
    import json
    import shutil

    folder = tmp_path_factory.mktemp("bge-style") / "model"
    shutil.copytree(minilm_dir, folder)
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": 384, "pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False}))
    (folder / "config_sentence_transformers.json").write_text(json.dumps(
        {"prompts": {"query": "query: ", "passage": "passage: "}, "default_prompt_name": "query"}))
    return folder


def test_a_folders_pooling_and_prompts_are_served_as_sentence_transformers_encodes(cls_prompted_dir):
    from sentence_transformers import SentenceTransformer

    reference = SentenceTransformer(str(cls_prompted_dir), device="cpu")
    with TestClient(create_app(load_models(str(cls_prompted_dir)))) as client:
        info = client.get("/info").json()
        default = client.post("/embed", json={"inputs": TEXTS}).json()  # the folder's default prompt, "query"
        passage = client.post("/embed", json={"inputs": TEXTS, "prompt_name": "passage"}).json()
        tokens = client.post("/tokenize", json={"inputs": "ok", "prompt_name": "passage"}).json()[0]
    # sentence-transformers 6 gives every model "query" and "document" (empty unless the folder sets them)
    assert info["pooling"] == "cls" and info["prompts"] == ["query", "document", "passage"]
    assert info["default_prompt"] == "query: "
    assert cosines(default, reference.encode(TEXTS)).min() >= 0.9999
    assert cosines(passage, reference.encode(TEXTS, prompt_name="passage")).min() >= 0.9999
    assert [t["piece"] for t in tokens] == ["[CLS]", "passage", ":", "ok", "[SEP]"]
    with TestClient(create_app(load_models(str(cls_prompted_dir)), ServeSettings(default_prompt_name="passage"))) as c:
        np.testing.assert_allclose(c.post("/embed", json={"inputs": TEXTS}).json(), passage, atol=1e-6)
    with pytest.raises(ValueError, match="query, document, passage"):
        create_app(load_models(str(cls_prompted_dir)), ServeSettings(default_prompt_name="title"))
