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
    ("prompt_excluded", "include_prompt is false"),
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
