"""One rule in every route: /search's input-length rule, the folder's default prompt read as
sentence-transformers reads it, and the server's prompts on /embed_sparse."""
import json
import shutil

import numpy as np
import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from bertforge.serve.app import create_app  # noqa: E402
from bertforge.serve.models import load_models  # noqa: E402
from bertforge.serve.settings import ServeSettings  # noqa: E402
from serve_support import sentence_index  # noqa: E402

PASSAGES = ["The bank raised its interest rates.", "Cats sleep most of the day.", "The river bank was muddy."]
LONG = " ".join(f"word{i % 50} alpha beta" for i in range(200)) + " cats"  # about 800 tokens


def prompted_folder(folder, minilm_dir, settings: dict):
    """MiniLM as an ST folder whose config_sentence_transformers.json is `settings`."""
    shutil.copytree(minilm_dir, folder)
    (folder / "config_sentence_transformers.json").write_text(json.dumps(settings))
    return folder


@pytest.fixture(scope="module")
def index(minilm_dir):
    return sentence_index(minilm_dir, PASSAGES)


def test_search_refuses_a_query_over_the_input_limit_unless_asked_to_truncate(minilm_dir, index):
    models = load_models(str(minilm_dir), index=index)
    with TestClient(create_app(models, ServeSettings(max_input_length=32))) as client:
        refused = client.post("/search", json={"query": LONG, "top_k": 3})
        embed = client.post("/embed", json={"inputs": LONG})
        short = client.post("/search", json={"query": PASSAGES[1], "top_k": 1})
        cut = client.post("/search", json={"query": [LONG], "top_k": 3, "truncate": True})
        vectors = np.array(client.post("/embed", json={"inputs": [LONG, *PASSAGES], "truncate": True}).json())
    assert refused.status_code == embed.status_code == 422
    assert "limit of 32" in refused.json()["error"] and "truncate" in refused.json()["error"]
    assert short.status_code == 200 and short.json()[0][0]["text"] == PASSAGES[1]
    assert cut.status_code == 200
    scores = {hit["text"]: hit["score"] for hit in cut.json()[0]}  # searched with the query's first 32 tokens
    expected = vectors[1:] @ vectors[0]
    np.testing.assert_allclose([scores[text] for text in PASSAGES], expected, atol=1e-4)
    assert index.embedder.max_length == 256  # the index's own model still cuts at its own limit
    with TestClient(create_app(models, ServeSettings(max_input_length=32, auto_truncate=True))) as client:
        auto = client.post("/search", json={"query": LONG, "top_k": 3})
    assert auto.status_code == 200 and [h["score"] for h in auto.json()[0]] == [h["score"] for h in cut.json()[0]]


def test_search_counts_the_index_models_limit_too(minilm_dir, index):
    with TestClient(create_app(load_models(str(minilm_dir), index=index))) as client:  # 512 here, 256 the model's
        refused = client.post("/search", json={"query": LONG})
        cut = client.post("/search", json={"query": LONG, "truncate": True})
    assert refused.status_code == 422 and "limit of 256" in refused.json()["error"]
    assert cut.status_code == 200 and len(cut.json()[0]) == len(PASSAGES)



def test_a_search_the_index_cannot_run_is_424_not_a_bad_input(minilm_dir, index, monkeypatch):
    """bm25s missing for a hybrid index: the route meant 424, but the model thread's ValueError became 422 first."""
    models = load_models(str(minilm_dir), index=index)

    def no_bm25(*args, **kwargs):
        raise ValueError("hybrid search needs bm25s: pip install 'bertforge[search]'")

    monkeypatch.setattr(type(index), "search", no_bm25)
    with TestClient(create_app(models)) as client:
        answer = client.post("/search", json={"query": "cats", "dense_weight": 0.5})
    assert answer.status_code == 424 and "bm25s" in answer.json()["error"]


def test_search_ranks_by_a_sentence_weight_the_index_holds_vectors_for(minilm_dir, index):
    """/search takes sentence_weight as Index.search does (and /info shows the index's); asked of an index without
    sentence vectors it is the request's mistake, 422, not the backend's 424."""
    from bertforge.search import Index
    from bertforge.tasks.retrieval.sentences import sentence_scorer

    texts = ["The bank raised its rates. Cats sleep most of the day.", "The river bank was muddy.", PASSAGES[0]]
    with_sentences = Index.build(texts, minilm_dir, sentence_weight=0.5, progress=False)
    models = load_models(str(minilm_dir), index=with_sentences)
    with TestClient(create_app(models)) as client:
        info = client.get("/info").json()["index"]
        answer = client.post("/search", json={"query": "sleeping cats", "top_k": 3, "sentence_weight": 1.0})
    assert info["sentence_weight"] == 0.5 and info["sentence_vectors"]  # the explorer enables its sentence weight
    expected = sentence_scorer(with_sentences.embedder.encode, 1.0)(["sleeping cats"], texts)[0]
    scores = {hit["text"]: hit["score"] for hit in answer.json()[0]}
    np.testing.assert_allclose([scores[text] for text in texts], expected, atol=1e-4)
    with TestClient(create_app(load_models(str(minilm_dir), index=index))) as client:
        refused = client.post("/search", json={"query": "cats", "sentence_weight": 0.5})
    assert refused.status_code == 422 and "sentence vectors" in refused.json()["error"]


def test_search_ranks_by_a_neighbour_weight(minilm_dir):
    """/search takes neighbour_weight as Index.search does (and /info shows the index's): each passage's score mixed
    with its best neighbour's in its document (tasks/retrieval/neighbours.py); outside 0..1 it is 422."""
    from bertforge.search import Index
    from bertforge.tasks.retrieval.neighbours import neighbour_mixed

    texts = ["The bank raised its rates.", "Cats sleep most of the day.", "The river bank was muddy.", PASSAGES[0]]
    follows = [False, True, False, True]
    with_neighbours = Index.build(texts, minilm_dir, follows=follows, neighbour_weight=0.5, progress=False)
    with TestClient(create_app(load_models(str(minilm_dir), index=with_neighbours))) as client:
        info = client.get("/info").json()["index"]
        answers = [client.post("/search", json={"query": "sleeping cats", "top_k": 4, **weight})
                   for weight in ({}, {"neighbour_weight": 1.0})]
        refused = client.post("/search", json={"query": "cats", "neighbour_weight": 1.5})
    assert info["neighbour_weight"] == 0.5
    vectors = with_neighbours.embedder.encode(["sleeping cats", *texts])
    cosines = vectors[:1] @ vectors[1:].T
    for answer, weight in zip(answers, (0.5, 1.0)):
        scores = {hit["text"]: hit["score"] for hit in answer.json()[0]}
        np.testing.assert_allclose([scores[text] for text in texts], neighbour_mixed(cosines, follows, weight)[0],
                                   atol=1e-4)
    assert refused.status_code == 422 and "neighbour_weight" in refused.text


def test_a_folders_default_prompt_name_outside_its_prompts_is_read_as_sentence_transformers_reads_it(
        tmp_path, minilm_dir):
    folder = prompted_folder(tmp_path / "model", minilm_dir,
                             {"prompts": {"passage": "passage: "}, "default_prompt_name": "query"})
    models = load_models(str(folder))
    with TestClient(create_app(models)) as client:  # sentence-transformers 6.2 and `bertforge embed`: no prompt
        assert client.get("/info").json()["default_prompt"] == ""
        plain = client.post("/embed", json={"inputs": PASSAGES}).json()
        passage = client.post("/embed", json={"inputs": PASSAGES, "prompt_name": "passage"}).json()
    with TestClient(create_app(load_models(str(minilm_dir)))) as client:
        np.testing.assert_allclose(plain, client.post("/embed", json={"inputs": PASSAGES}).json(), atol=1e-6)
        assert not np.allclose(passage, plain, atol=1e-3)
    with pytest.raises(ValueError, match="--default-prompt-name title: the model's prompts are query, document, "
                                         "passage"):
        create_app(models, ServeSettings(default_prompt_name="title"))  # a name the user gave is checked


def test_embed_sparse_applies_the_servers_prompts(tmp_path, minilm_dir, cassette_dir):
    folder = prompted_folder(tmp_path / "prompted", minilm_dir, {"prompts": {"query": "query: ", "passage": "p: "}})
    with TestClient(create_app(load_models(str(folder), mlm=str(cassette_dir)))) as client:
        assert client.get("/info").json()["prompts"] == ["query", "document", "passage"]
        named = client.post("/embed_sparse", json={"inputs": "hello", "prompt_name": "query"})
        written = client.post("/embed_sparse", json={"inputs": "query: hello"})
        unknown = client.post("/embed_sparse", json={"inputs": "hello", "prompt_name": "title"})
        fill = client.post("/fill-mask", json={"inputs": "the cat [MASK] on the mat"})
    assert named.status_code == 200 and named.json() == written.json()
    assert unknown.status_code == 422 and "prompted's prompts: query, document, passage" in unknown.json()["error"]
    assert fill.status_code == 200


def test_an_mlm_head_is_told_by_its_weights_as_fill_mask_and_adapt_tell_it(cassette_dir, minilm_dir, tmp_path):
    """The server went by config.json's architecture: a checkpoint with its MLM head but no architecture named (as
    converted checkpoints often are) had no /fill-mask and was refused as --mlm, while `fill-mask` answered; MiniLM
    relabelled BertForMaskedLM was served with a random head, while `fill-mask` refused it."""
    from bertforge.models.folder import read_model_folder
    from bertforge.serve.models import load_masked_lm

    unnamed = shutil.copytree(cassette_dir, tmp_path / "unnamed")
    config = json.loads((unnamed / "config.json").read_text())
    config.pop("architectures")
    (unnamed / "config.json").write_text(json.dumps(config))
    assert load_masked_lm(str(unnamed), read_model_folder(unnamed), None, "cpu") is not None
    assert load_masked_lm("minilm", read_model_folder(minilm_dir), str(unnamed), "cpu") is not None
    relabelled = shutil.copytree(minilm_dir, tmp_path / "relabelled")
    config = json.loads((relabelled / "config.json").read_text())
    config["architectures"] = ["BertForMaskedLM"]
    (relabelled / "config.json").write_text(json.dumps(config))
    assert load_masked_lm(str(relabelled), read_model_folder(relabelled), None, "cpu") is None
    with pytest.raises(ValueError, match="without MLM head weights"):
        load_masked_lm("minilm", read_model_folder(minilm_dir), str(relabelled), "cpu")


def test_sentence_transformers_standard_prompt_names_are_served_empty(minilm_dir):
    """sentence-transformers 6 gives every model the prompts "query" and "document" (empty unless a folder sets
    them): `encode(prompt_name="document")` embeds the text as it is, where /embed answered 422."""
    from sentence_transformers import SentenceTransformer

    from bertforge.models.folder import read_model_folder

    reference = SentenceTransformer(str(minilm_dir), device="cpu")
    assert read_model_folder(minilm_dir).prompts == reference.prompts
    with TestClient(create_app(load_models(str(minilm_dir)))) as client:
        for name in ("query", "document"):
            answer = client.post("/embed", json={"inputs": PASSAGES, "prompt_name": name})
            assert answer.status_code == 200
            np.testing.assert_allclose(answer.json(), reference.encode(PASSAGES, prompt_name=name), atol=1e-5)


def test_a_prompt_the_pooling_leaves_out_is_refused_at_every_door(tmp_path, minilm_dir):
    """A folder whose Pooling says include_prompt false (sentence-transformers pools the text without its prompt):
    the server's prompt_name and Embedder(prompt=...) pooled the prompt's tokens too, cosine 0.54-0.91 to
    sentence-transformers, silently; only the folder's default prompt was refused. Now every door refuses a
    non-empty prompt there in one line, and serves the text without one as sentence-transformers does."""
    from sentence_transformers import SentenceTransformer

    from bertforge.embeddings.embed import Embedder

    folder = prompted_folder(tmp_path / "model", minilm_dir, {"prompts": {"query": "Represent this sentence: "}})
    pooling_file = folder / "1_Pooling" / "config.json"
    pooling = json.loads(pooling_file.read_text())
    pooling_file.write_text(json.dumps({**pooling, "include_prompt": False}))
    reference = SentenceTransformer(str(folder), device="cpu")
    with TestClient(create_app(load_models(str(folder)))) as client:
        refused = client.post("/embed", json={"inputs": PASSAGES, "prompt_name": "query"})
        assert refused.status_code == 422 and "include_prompt" in refused.json()["error"]
        for body in ({"inputs": PASSAGES}, {"inputs": PASSAGES, "prompt_name": "document"}):  # "": nothing left out
            np.testing.assert_allclose(client.post("/embed", json=body).json(), reference.encode(PASSAGES),
                                       atol=1e-5)
    with pytest.raises(ValueError, match="include_prompt"):
        Embedder.from_pretrained(folder, prompt="Represent this sentence: ")
    with pytest.raises(ValueError, match="--default-prompt.*include_prompt"):
        create_app(load_models(str(folder)), ServeSettings(default_prompt_name="query"))
