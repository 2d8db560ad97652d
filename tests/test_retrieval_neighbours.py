"""The neighbour rule (tasks/retrieval/neighbours.py) against a loop over rows, and where the corpus reader says
passages follow one another (search/documents.py)."""
import gzip
import json

import numpy as np
import pytest

from bertforge.tasks.retrieval.neighbours import best_neighbour, continuing, neighbour_mixed, with_neighbours


def by_loop(scores, follows, weight):
    """The module doc's formula, a row at a time."""
    mixed = np.array(scores, dtype=np.float64)
    for q in range(scores.shape[0]):
        for row in range(scores.shape[1]):
            around = [scores[q, row - 1]] if row > 0 and follows[row] else []
            around += [scores[q, row + 1]] if row + 1 < scores.shape[1] and follows[row + 1] else []
            around = [s for s in around if s != -np.inf]
            best = max(around) if around else scores[q, row]
            mixed[q, row] = (1 - weight) * scores[q, row] + weight * best
    return mixed


def test_each_row_mixes_in_its_best_neighbour_in_its_own_document():
    rng = np.random.default_rng(0)
    scores = rng.normal(size=(4, 9)).astype(np.float32)
    follows = np.array([False, True, True, False, True, False, False, True, True])  # documents 0-2, 3-4, 5, 6-8
    for weight in (0.1, 0.3, 0.5):
        np.testing.assert_allclose(neighbour_mixed(scores, follows, weight), by_loop(scores, follows, weight),
                                   rtol=1e-6)
    # row 5 is a document alone: its own score; row 2 ends a document: row 1 is its only neighbour
    np.testing.assert_allclose(best_neighbour(scores, follows)[:, 5], scores[:, 5])
    np.testing.assert_allclose(best_neighbour(scores, follows)[:, 2], scores[:, 1])


def test_nothing_changes_without_neighbours_or_weight():
    scores = np.arange(12, dtype=np.float32).reshape(2, 6)
    assert neighbour_mixed(scores, np.ones(6, bool), 0.0) is scores
    assert neighbour_mixed(scores, np.zeros(6, bool), 0.4) is scores  # records: documents of their own
    assert neighbour_mixed(scores, None, 0.4) is scores


def test_a_left_out_row_stays_left_out_and_is_no_rows_neighbour():
    scores = np.array([[0.2, -np.inf, 0.9, 0.1]], dtype=np.float32)
    mixed = neighbour_mixed(scores, np.array([False, True, True, True]), 0.5)
    assert mixed[0, 1] == -np.inf and not np.isnan(mixed).any()
    np.testing.assert_allclose(mixed, by_loop(scores, [False, True, True, True], 0.5))
    assert mixed[0, 0] == pytest.approx(0.2)  # its only neighbour left out: its own score


def test_a_subset_of_rows_follows_only_where_it_is_the_next_row():
    follows = np.array([False, True, True, True, False, True])
    assert continuing(follows, [0, 1, 3, 4, 5]).tolist() == [False, True, False, False, True]
    assert with_neighbours(np.array([2, 4]), follows).tolist() == [1, 2, 3, 4, 5]  # 4 starts a document
    assert with_neighbours(np.array([0]), follows).tolist() == [0, 1]


def test_the_simplest_settings_have_the_fewest_neighbours_then_sentences_then_bm25():
    from bertforge.tasks.retrieval.sentences import best_weights, simplest_within_one_se

    assert best_weights({(0.0, 1.0, 0.2): 0.5, (0.25, 0.9, 0.0): 0.5, (0.0, 0.8, 0.0): 0.5}) == (0.0, 0.8, 0.0)
    best = np.array([1.0, 1.0, 0.0, 1.0])
    per_query = {(0.0, 1.0, 0.3): best, (0.0, 1.0, 0.0): np.array([0.0, 0.0, 0.0, 1.0]),
                 (0.25, 1.0, 0.1): np.array([1.0, 1.0, 0.0, 0.8])}
    assert simplest_within_one_se(per_query) == (0.25, 1.0, 0.1)  # within one SE, fewer neighbours than the best


def test_a_text_files_passages_follow_one_another_and_records_do_not(tmp_path):
    from bertforge.search.documents import read_corpus, write_passages_file

    words = " ".join(["word"] * 45)
    (tmp_path / "book.txt").write_text("\n\n".join(f"Para {i} {words}." for i in range(3)))
    with gzip.open(tmp_path / "notes.txt.gz", "wt") as notes:
        notes.write(f"Note one {words}.\n\nNote two {words}.")
    long = " ".join(f"Sentence {i} {' '.join(['long'] * 20)}." for i in range(12))  # split in parts
    (tmp_path / "records.jsonl").write_text("\n".join(json.dumps({"text": t}) for t in
                                                      (f"A record {words}.", long, f"Another {words}.")))
    corpus = read_corpus([tmp_path])
    ids = [corpus.passages[i].id for i in range(len(corpus.passages))]
    follows = dict(zip(ids, corpus.passages.follows.tolist()))
    assert [follows[f"book.txt:{i}"] for i in range(3)] == [False, True, True]
    assert [follows["notes.txt.gz:0"], follows["notes.txt.gz:1"]] == [False, True]  # a new file: a new document
    parts = [i for i in ids if i.startswith("records.jsonl:2#")]
    assert len(parts) > 1 and [follows[i] for i in parts] == [False] + [True] * (len(parts) - 1)
    assert not follows["records.jsonl:1"] and not follows["records.jsonl:3"]
    write_passages_file(corpus.passages, tmp_path / "passages.jsonl")
    written = [json.loads(line) for line in (tmp_path / "passages.jsonl").read_text().splitlines()]
    assert [record.get("follows", False) for record in written] == corpus.passages.follows.tolist()
    assert all(record["follows"] is True for record in written if "follows" in record)
