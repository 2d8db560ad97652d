"""One reader of a checkpoint folder (bertforge.models.folder), and every command's vectors from it
equal to sentence-transformers' own for each pooling x Normalize.

The ST folders are written by sentence-transformers itself from one tiny random BertModel, once
per session; older formats (2.x type names, pooling_mode_* booleans, a 0_Transformer subfolder)
are written by hand as those releases wrote them.
"""
from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest

from bertforge.models.folder import ModelFolder, read_model_folder

TEXTS = ["A short one.", "The cat sat on the mat, and then it left the house for the garden.",
         "Emma Woodhouse, handsome, clever, and rich, with a comfortable home and happy disposition.", "Hi"]
POOLINGS = ["cls", "mean", "max", "mean_sqrt_len_tokens", "weightedmean", "lasttoken"]
MAX_SEQ_LENGTH = 16  # shorter than the longest text, so truncation is checked too
LEGACY = "sentence_transformers.models."


def sentence_transformers():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import sentence_transformers
        import sentence_transformers.models  # noqa: F401  (the module names sentence-transformers documents)
    return sentence_transformers


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory, minilm_dir) -> Path:
    """A random 2-layer BertModel (hidden 32) with MiniLM's vocabulary, saved by transformers."""
    import torch
    import transformers

    folder = tmp_path_factory.mktemp("tiny-bert")
    config = transformers.BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=37, max_position_embeddings=64)
    torch.manual_seed(0)
    transformers.BertModel(config).save_pretrained(folder)
    transformers.AutoTokenizer.from_pretrained(minilm_dir).save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def st_folders(tiny_bert, tmp_path_factory) -> dict[tuple[str, bool], tuple[Path, np.ndarray]]:
    """(pooling, normalize) -> (an ST folder saved by sentence-transformers, its encode(TEXTS))."""
    st = sentence_transformers()
    transformer = st.models.Transformer(str(tiny_bert), max_seq_length=MAX_SEQ_LENGTH)
    root = tmp_path_factory.mktemp("st-folders")
    folders = {}
    for pooling in [*POOLINGS, ("cls", "mean")]:
        for normalize in (False, True):
            modules = [transformer, st.models.Pooling(32, pooling)] + ([st.models.Normalize()] if normalize else [])
            name = "+".join(pooling) if isinstance(pooling, tuple) else pooling
            folder = root / f"{name}-{'norm' if normalize else 'raw'}"
            model = st.SentenceTransformer(modules=modules, device="cpu")
            model.save(str(folder))
            folders[(name, normalize)] = folder, model.encode(TEXTS, convert_to_numpy=True)
    return folders


def test_every_list_of_pooling_modes_names_the_modes_pooling_computes():
    """The modes are named where each list is needed: the functions (embeddings/pooling.py), the choices the
    command line offers without importing torch (embeddings/__init__.py) and sentence-transformers' config keys
    (models/folder.py). A mode added to one and not the others fails here, not in a user's folder."""
    from typing import get_args

    from bertforge.embeddings import Pooling, SentencePooling
    from bertforge.embeddings.pooling import POOL_FUNCTIONS
    from bertforge.models.folder import POOLING_MODES

    assert set(get_args(SentencePooling)) == set(POOL_FUNCTIONS) == set(POOLING_MODES) == set(POOLINGS)
    assert set(get_args(Pooling)) == {*POOL_FUNCTIONS, "pooler"}  # the model's pooler_output: Embedder alone


def assert_same_vectors(actual: np.ndarray, expected: np.ndarray, minimum: float = 0.99999) -> None:
    assert actual.shape == expected.shape
    cosine = (actual * expected).sum(1) / np.linalg.norm(actual, axis=1) / np.linalg.norm(expected, axis=1)
    assert cosine.min() >= minimum, cosine
    np.testing.assert_allclose(np.linalg.norm(actual, axis=1), np.linalg.norm(expected, axis=1), rtol=1e-4)


def write_json(path: Path, value) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value), encoding="utf-8")


def legacy_folder(tiny_bert: Path, target: Path, pooling_config: dict, extra_modules=(), subfolder: str = "") -> Path:
    """An ST 2.x-style folder: classic type names, pooling_mode_* booleans, sentence_bert_config.json."""
    shutil.copytree(tiny_bert, target / subfolder, dirs_exist_ok=True)
    modules = [{"idx": 0, "name": "0", "path": subfolder, "type": LEGACY + "Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": LEGACY + "Pooling"}, *extra_modules]
    write_json(target / "modules.json", modules)
    write_json(target / subfolder / "sentence_bert_config.json", {"max_seq_length": 12, "do_lower_case": True})
    write_json(target / "1_Pooling" / "config.json", {"word_embedding_dimension": 32, **pooling_config})
    return target


# ---- the reader ------------------------------------------------------------------------------------

def test_reads_what_sentence_transformers_6_writes(st_folders):
    for (pooling, normalize), (folder, _) in st_folders.items():
        read = read_model_folder(folder)
        assert (read.pooling, read.normalize, read.sentence_transformers) == (pooling, normalize, True)
        assert (read.transformer, read.architecture, read.max_seq_length) == (folder, "BertModel", MAX_SEQ_LENGTH)
        assert read.similarity_fn_name == "cosine" and read.default_prompt == ""


def test_reads_the_real_minilm_folder(minilm_dir):
    st = sentence_transformers()
    read = read_model_folder(minilm_dir)
    model = st.SentenceTransformer(str(minilm_dir), device="cpu")
    assert (read.pooling, read.normalize) == ("mean", True)
    assert read.max_seq_length == model.max_seq_length == 256


def test_plain_checkpoint_defaults(tiny_bert, cassette_dir):
    read = read_model_folder(tiny_bert)
    assert read == ModelFolder(root=tiny_bert, transformer=tiny_bert, max_seq_length=64)  # tokenizer's 512, positions 64
    assert read_model_folder(cassette_dir).architecture == "BertForMaskedLM"


def test_legacy_booleans_transformer_subfolder_and_lower_case(tiny_bert, tmp_path):
    flags = {"pooling_mode_cls_token": False, "pooling_mode_mean_tokens": True, "pooling_mode_max_tokens": True}
    normalize = {"idx": 2, "name": "2", "path": "2_Normalize", "type": LEGACY + "Normalize"}
    read = read_model_folder(legacy_folder(tiny_bert, tmp_path / "st", flags, [normalize], subfolder="0_Transformer"))
    # ST concatenates in its own order (cls, max, mean, ...), not the file's.
    assert (read.pooling, read.pooling_modes, read.normalize) == ("max+mean", ("max", "mean"), True)
    assert (read.transformer, read.max_seq_length, read.do_lower_case) == (tmp_path / "st" / "0_Transformer", 12, True)


def test_no_pooling_flag_means_mean_and_6x_list(tiny_bert, tmp_path):
    assert read_model_folder(legacy_folder(tiny_bert, tmp_path / "a", {})).pooling == "mean"
    listed = legacy_folder(tiny_bert, tmp_path / "b", {"pooling_mode": ["lasttoken", "cls"]})
    assert read_model_folder(listed).pooling == "lasttoken+cls"


def test_prompts_and_similarity(tiny_bert, tmp_path):
    folder = legacy_folder(tiny_bert, tmp_path / "st", {"pooling_mode": "cls"})
    write_json(folder / "config_sentence_transformers.json",
               {"prompts": {"query": "query: ", "passage": "passage: "}, "default_prompt_name": "query",
                "similarity_fn_name": "dot"})
    read = read_model_folder(folder)
    assert (read.default_prompt, read.similarity_fn_name) == ("query: ", "dot")


@pytest.mark.parametrize("case, message", [
    ("dense", "module Dense"),
    ("custom", "module MyPooling"),
    ("no_pooling", "has no Pooling module"),
    ("normalize_first", "not the pooled sentence vector"),
    ("bad_mode", "is not one of cls, max, mean"),
    ("damaged", "is not valid JSON"),
    ("not_a_list", "holds a JSON dict"),
    ("sparse", "model_type 'SparseEncoder'"),
    ("prompt_excluded", "leaves the prompt out of the vector (include_prompt false)"),
])
def test_refuses_what_it_cannot_reproduce_in_one_line_naming_the_file(tiny_bert, tmp_path, case, message):
    folder = legacy_folder(tiny_bert, tmp_path / "st", {"pooling_mode_mean_tokens": True})
    modules = json.loads((folder / "modules.json").read_text())
    if case == "dense":
        modules.append({"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.base.modules.dense.Dense"})
    elif case == "custom":
        modules[1]["type"] = "my_package.MyPooling"
    elif case == "no_pooling":
        modules = modules[:1]
    elif case == "normalize_first":
        modules.insert(1, {"idx": 1, "name": "n", "path": "n", "type": LEGACY + "Normalize"})
    write_json(folder / "modules.json", modules)
    if case == "bad_mode":
        write_json(folder / "1_Pooling" / "config.json", {"pooling_mode": "median"})
    elif case == "damaged":
        (folder / "1_Pooling" / "config.json").write_text("{not json")
    elif case == "not_a_list":
        write_json(folder / "modules.json", {"0": "Transformer"})
    elif case == "sparse":
        write_json(folder / "config_sentence_transformers.json", {"model_type": "SparseEncoder"})
    elif case == "prompt_excluded":
        write_json(folder / "1_Pooling" / "config.json", {"pooling_mode": "mean", "include_prompt": False})
        write_json(folder / "config_sentence_transformers.json", {"prompts": {"q": "q: "}, "default_prompt_name": "q"})
    with pytest.raises(ValueError) as raised:
        read_model_folder(folder)
    text = str(raised.value)
    assert message in text and str(folder) in text and "\n" not in text


def test_a_folder_without_config_json_is_named(tmp_path):
    with pytest.raises(ValueError, match=f"{tmp_path} is not a checkpoint folder"):
        read_model_folder(tmp_path)


# ---- every way in gives sentence-transformers' vectors -----------------------------------------------

def unit(vectors: np.ndarray) -> np.ndarray:
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def test_embed_and_embedder_follow_the_folder(st_folders):
    from bertforge import embed
    from bertforge.embeddings.embed import Embedder

    for (pooling, normalize), (folder, expected) in st_folders.items():
        embedder = Embedder.from_pretrained(folder)
        assert (embedder.pooling, embedder.normalize, embedder.max_length) == (pooling, normalize, MAX_SEQ_LENGTH)
        assert_same_vectors(embedder.encode(TEXTS), expected)
    for case in [("cls", True), ("lasttoken", False)]:
        assert_same_vectors(embed(str(st_folders[case][0]), TEXTS), st_folders[case][1])


def test_an_older_folder_written_by_hand_is_read_as_sentence_transformers_reads_it(tiny_bert, tmp_path):
    """2.x names, pooling_mode_* booleans (concatenated), the transformer in 0_Transformer, do_lower_case."""
    from bertforge import embed

    st = sentence_transformers()
    flags = {"pooling_mode_mean_tokens": True, "pooling_mode_cls_token": True, "pooling_mode_lasttoken": True}
    folder = legacy_folder(tiny_bert, tmp_path / "st", flags, subfolder="0_Transformer")
    texts = [text.upper() for text in TEXTS]
    expected = st.SentenceTransformer(str(folder), device="cpu").encode(texts)
    assert expected.shape == (len(texts), 96)
    assert_same_vectors(embed(str(folder), texts), expected)


def test_several_modes_concatenate_in_the_order_sentence_transformers_gives_each_format(tiny_bert, tmp_path):
    """ST 6 concatenates a `pooling_mode` list in its own order and the older booleans in its fixed one (cls, max,
    mean, ...). A folder ST 6 saved with ["mean", "cls"] was read [cls | mean] (cosine 0.44 to ST's vectors)."""
    from bertforge.embeddings.embed import Embedder

    st = sentence_transformers()
    transformer = st.models.Transformer(str(tiny_bert), max_seq_length=MAX_SEQ_LENGTH)
    listed = tmp_path / "listed"
    modules = [transformer, st.models.Pooling(32, ["mean", "cls"])]
    st.SentenceTransformer(modules=modules, device="cpu").save(str(listed))
    assert json.loads((listed / "1_Pooling" / "config.json").read_text())["pooling_mode"] == ["mean", "cls"]
    booleans = legacy_folder(tiny_bert, tmp_path / "booleans", {"pooling_mode_mean_tokens": True,
                                                                "pooling_mode_cls_token": True})
    for folder, pooling in ((listed, "mean+cls"), (booleans, "cls+mean")):
        expected = st.SentenceTransformer(str(folder), device="cpu").encode(TEXTS)
        embedder = Embedder.from_pretrained(folder)
        assert embedder.pooling == pooling
        np.testing.assert_allclose(embedder.encode(TEXTS), expected, atol=1e-5)


def test_the_pooling_config_written_is_read_back_in_the_order_named(tmp_path):
    """Booleans where ST reads them in the order named (one mode, or ST's fixed order), which every release reads;
    a 6.x list otherwise, the booleans being read back in the fixed order."""
    from bertforge.models.folder import pooling_config, read_pooling

    for pooling in ("mean", "cls+mean", "mean+cls", "max+mean+cls", "lasttoken+cls", "mean+mean"):
        config = pooling_config(pooling, 32)
        assert ("pooling_mode" in config) == (pooling in ("mean+cls", "max+mean+cls", "lasttoken+cls", "mean+mean"))
        write_json(tmp_path / pooling / "config.json", config)
        assert read_pooling(tmp_path / pooling / "config.json")["mode"] == pooling
    with pytest.raises(ValueError, match="median"):
        pooling_config("mean+median", 32)


def test_cli_embed_follows_the_folder_and_says_when_an_option_overrides_it(st_folders, tmp_path):
    from cli_run import run_cli

    source = tmp_path / "texts.txt"
    source.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    # Each pooling once, normalised or not in turn (the full cross runs through Embedder above).
    for number, pooling in enumerate(POOLINGS):
        normalize = bool(number % 2)
        folder, expected = st_folders[(pooling, normalize)]
        code, _, err = run_cli("embed", source, tmp_path / f"{pooling}-{normalize}.npy", "--model", folder)
        assert code == 0 and "overrides" not in err, err
        assert_same_vectors(np.load(tmp_path / f"{pooling}-{normalize}.npy"), expected)
    folder, _ = st_folders[("cls", True)]
    code, _, err = run_cli("embed", source, tmp_path / "over.npy", "--model", folder, "--pooling", "mean",
                           "--no-normalize")
    assert code == 0
    assert "pooling: cls (from the folder's sentence-transformers modules); --pooling mean overrides it" in err
    assert "normalize: true (from the folder's sentence-transformers modules); --no-normalize overrides it" in err
    assert_same_vectors(np.load(tmp_path / "over.npy"), st_folders[("mean", False)][1])


def test_index_build_and_search_follow_the_folder(st_folders, tmp_path):
    from cli_run import run_cli

    from bertforge.search.index import Index

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    st = sentence_transformers()
    for case in [("cls", True), ("weightedmean", False), ("cls+mean", False)]:
        folder, expected = st_folders[case]
        output = tmp_path / "+".join(map(str, case))
        code, out, err = run_cli("index", "build", corpus, "--output", output, "--model", folder)
        assert code == 0, err
        index = Index.load(output)
        assert (index.spec.pooling, index.spec.max_length) == (case[0], MAX_SEQ_LENGTH)
        assert_same_vectors(index.faiss_index.reconstruct_n(0, len(TEXTS)), unit(expected))
        query = "a cat in the garden"
        code, out, err = run_cli("search", output, query, "--as-json", "--top-k", str(len(TEXTS)))
        assert code == 0, err
        hits = [json.loads(line) for line in out.splitlines()]
        query_vector = unit(st.SentenceTransformer(str(folder), device="cpu").encode([query]))[0]
        truth = unit(expected) @ query_vector
        np.testing.assert_allclose([hit["score"] for hit in hits], np.sort(truth)[::-1], atol=1e-4)


def test_sbert_evaluate_encodes_as_the_folder_does(st_folders):
    from bertforge.embeddings.embed import load_tokenizer
    from bertforge.tasks.retrieval.bi_encoder import BiEncoder
    from bertforge.tasks.retrieval.evaluation import encoder_embedder

    for (pooling, normalize), (folder, expected) in st_folders.items():
        model = BiEncoder.from_pretrained(folder)
        assert (model.pooling, model.normalize, model.max_seq_length) == (pooling, normalize, MAX_SEQ_LENGTH)
        embedder = encoder_embedder(model, load_tokenizer(read_model_folder(folder)))
        assert_same_vectors(embedder.encode(TEXTS), expected)


def test_export_onnx_follows_the_folder(st_folders, tmp_path):
    pytest.importorskip("onnxruntime")
    import onnxruntime
    from cli_run import run_cli

    from bertforge import BertTokenizer

    for case in [("cls+mean", True)]:  # several modes and Normalize in one graph (an export takes seconds)
        folder, expected = st_folders[case]
        output = tmp_path / f"onnx-{case[0]}-{case[1]}"
        code, _, err = run_cli("export", "onnx", folder, output)
        assert code == 0, err
        session = onnxruntime.InferenceSession(str(output / "model.onnx"), providers=["CPUExecutionProvider"])
        inputs = BertTokenizer.from_pretrained(output)(TEXTS, padding=True, truncation=True, max_length=MAX_SEQ_LENGTH,
                                                       return_tensors="np")
        names = [o.name for o in session.get_outputs()]
        vectors = session.run(["sentence_embedding"], {i.name: inputs[i.name] for i in session.get_inputs()})[0]
        assert "sentence_embedding" in names
        assert_same_vectors(vectors, expected)


def test_cls_pooled_normalised_minilm_folder_embeds_as_sentence_transformers(minilm_dir, tmp_path):
    """A BGE/E5-style folder (CLS + Normalize) on real weights: `bertforge embed` wrote mean-pooled,
    unnormalised vectors at cosine 0.13 from sentence-transformers', with exit 0."""
    from cli_run import run_cli

    st = sentence_transformers()
    model = st.SentenceTransformer(modules=[st.models.Transformer(str(minilm_dir), max_seq_length=128),
                                            st.models.Pooling(384, "cls"), st.models.Normalize()], device="cpu")
    model.save(str(tmp_path / "cls-minilm"))
    source = tmp_path / "texts.txt"
    source.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    code, _, err = run_cli("embed", source, tmp_path / "v.npy", "--model", tmp_path / "cls-minilm")
    assert code == 0, err
    assert_same_vectors(np.load(tmp_path / "v.npy"), model.encode(TEXTS))


def test_a_default_prompt_is_put_before_every_text_as_sentence_transformers_does(tiny_bert, tmp_path):
    from bertforge import embed
    from bertforge.embeddings.embed import Embedder

    st = sentence_transformers()
    folder = legacy_folder(tiny_bert, tmp_path / "st", {"pooling_mode_mean_tokens": True})
    write_json(folder / "config_sentence_transformers.json",
               {"prompts": {"query": "query: ", "passage": ""}, "default_prompt_name": "query"})
    expected = st.SentenceTransformer(str(folder), device="cpu").encode(TEXTS)
    assert_same_vectors(embed(str(folder), TEXTS), expected)
    without = Embedder.from_pretrained(folder, prompt="").encode(TEXTS)  # the prompt is what makes them equal
    assert (unit(without) * unit(expected)).sum(1).min() < 0.999


def test_info_reads_the_model_class_from_a_transformer_subfolder(tiny_bert, tmp_path):
    from cli_run import run_cli

    folder = legacy_folder(tiny_bert, tmp_path / "st", {"pooling_mode_cls_token": True}, subfolder="0_Transformer")
    code, out, err = run_cli("info", "--model", folder)
    assert code == 0, err
    assert out.startswith("BertModel: 2 layers, hidden 32")


def test_a_hub_id_downloads_what_the_sentence_transformers_folder_needs(st_folders, tiny_bert, tmp_path,
                                                                        monkeypatch):
    """A hub repository is filtered by huggingface_hub's own pattern matcher, as snapshot_download filters it: a
    CLS-pooled, normalised ST repository (one with a 0_Transformer subfolder too) must not arrive as a plain,
    mean-pooled folder, and no second copy of the weights is fetched."""
    import huggingface_hub
    from huggingface_hub.utils import filter_repo_objects

    from bertforge import BertTokenizer

    flags = {"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False}
    normalize = {"idx": 2, "name": "2", "path": "2_Normalize", "type": LEGACY + "Normalize"}
    repositories = {"org/st-cls": st_folders[("cls", True)][0],
                    "org/st-legacy": legacy_folder(tiny_bert, tmp_path / "legacy", flags, [normalize], "0_Transformer")}
    (repositories["org/st-cls"] / "pytorch_model.bin").write_bytes(b"a second copy of the weights")

    def snapshot_download(repo_id, allow_patterns=None, **_):
        source, target = repositories[repo_id], tmp_path / "hub" / repo_id
        files = [p.relative_to(source).as_posix() for p in source.rglob("*") if p.is_file()]
        for name in filter_repo_objects(files, allow_patterns=allow_patterns):
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(source / name, target / name)
        return str(target)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    for repo_id, expected in (("org/st-cls", read_model_folder(repositories["org/st-cls"])),
                              ("org/st-legacy", read_model_folder(repositories["org/st-legacy"]))):
        read = read_model_folder(repo_id)
        assert (read.pooling, read.normalize, read.max_seq_length, read.do_lower_case) == \
            (expected.pooling, expected.normalize, expected.max_seq_length, expected.do_lower_case) == \
            ("cls", True, expected.max_seq_length, expected.do_lower_case)
        assert (read.transformer / "model.safetensors").is_file()
        assert BertTokenizer.from_pretrained(read.transformer).vocab == BertTokenizer.from_pretrained(tiny_bert).vocab
    assert not (tmp_path / "hub" / "org/st-cls" / "pytorch_model.bin").exists()
