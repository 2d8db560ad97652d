"""Retrieval metrics on hand-computable cases and against sentence-transformers' InformationRetrievalEvaluator."""
import math

import numpy as np
import pytest

from bertforge.tasks.retrieval.metrics import (ndcg_per_query, ranking_metrics, relevant_indices, retrieval_metrics,
                                               spearman, top_k)


def test_hand_computed_ranking():
    # Query 0 ranks documents 2, 0, 1, 3: its relevant documents 0 and 3 are at ranks 2 and 4.
    # Query 1 ranks 1 first, its only relevant document.
    scores = np.array([[0.5, 0.2, 0.9, 0.1], [0.1, 0.8, 0.3, 0.2]])
    metrics = retrieval_metrics(scores, [[0, 3], [1]])
    assert metrics["recall@1"] == pytest.approx((0 + 1) / 2)
    assert metrics["recall@10"] == pytest.approx(1.0)
    assert metrics["mrr@10"] == pytest.approx((1 / 2 + 1) / 2)
    ideal = 1 + 1 / math.log2(3)
    assert metrics["ndcg@10"] == pytest.approx(((1 / math.log2(3) + 1 / math.log2(5)) / ideal + 1) / 2)


def test_relevant_past_ten_counts_nothing_and_excluded_self_is_skipped():
    scores = np.tile(np.arange(20, 0, -1, dtype=float), (1, 1))  # document i ranked i-th
    assert retrieval_metrics(scores, [[12]]) == {"recall@1": 0.0, "recall@10": 0.0, "mrr@10": 0.0, "ndcg@10": 0.0}
    # With document 0 (the query's own copy) excluded, document 1 is first.
    assert retrieval_metrics(scores, [[1]], exclude=[0])["recall@1"] == 1.0
    assert retrieval_metrics(scores, [[1]])["recall@1"] == 0.0


def test_recall_at_deeper_cut_offs():
    scores = np.tile(np.arange(200, 0, -1, dtype=float), (1, 1))  # document i ranked i-th (rank i + 1)
    metrics = retrieval_metrics(scores, [[50, 150]], recall_at=(1, 10, 100))
    assert (metrics["recall@10"], metrics["recall@100"]) == (0.0, 0.5)
    assert "recall@1" in metrics and metrics["ndcg@10"] == 0.0


def test_rankings_already_made_score_as_their_score_matrix_and_minus_one_is_never_relevant():
    rng = np.random.default_rng(1)
    scores = rng.standard_normal((30, 50))
    relevant = [rng.choice(50, rng.integers(1, 4), replace=False).tolist() for _ in range(30)]
    assert ranking_metrics(top_k(scores, 10), relevant) == retrieval_metrics(scores, relevant)
    # a search that found two rows, then nothing (-1): document 4 is ranked second, document 0 not at all
    short = ranking_metrics(np.array([[7, 4, -1, -1]]), [[4, 0]])
    assert short["recall@10"] == 0.5 and short["mrr@10"] == 0.5
    assert short["ndcg@10"] == pytest.approx((1 / math.log2(3)) / (1 + 1 / math.log2(3)))


def test_ties_keep_corpus_order():
    assert top_k(np.array([[1.0, 2.0, 2.0, 0.0]]), 3).tolist() == [[1, 2, 0]]


def test_bad_inputs():
    with pytest.raises(ValueError, match="no relevant document"):
        retrieval_metrics(np.zeros((2, 3)), [[0], []])
    with pytest.raises(ValueError, match="one relevant set per query"):
        retrieval_metrics(np.zeros((2, 3)), [[0]])


def test_a_querys_own_document_is_never_found_even_in_a_corpus_no_deeper_than_the_ranking():
    """Pushed to -inf, the own document was still ranked (last) within a 4-document corpus's top 10 and counted as
    found: recall@10 1.0 and nDCG@10 0.6509 where BEIR's ignore_identical_ids gives 0.5 and 0.3869; adapt's
    recall@100 on 50 passages 1.0 for 0.0."""
    scores = np.array([[0.9, 0.5, 0.2, 1.0]])  # document 3 is the query's own copy, and judged relevant
    metrics = retrieval_metrics(scores, [[3, 1]], exclude=[3])
    assert metrics["recall@10"] == 0.5 and metrics["mrr@10"] == 0.5
    assert metrics["ndcg@10"] == pytest.approx((1 / math.log2(3)) / (1 + 1 / math.log2(3)))  # 0.3869
    scores = np.random.default_rng(0).random((1, 50))
    assert retrieval_metrics(scores, [[7]], exclude=[7], recall_at=(1, 10, 100))["recall@100"] == 0.0


def test_a_relevant_document_missing_from_the_corpus_is_relevant_and_never_found(caplog):
    """As pytrec_eval and sentence-transformers' evaluator count it (the whole set was refused before)."""
    with caplog.at_level("WARNING", logger="bertforge"):
        relevant = relevant_indices(["q1", "q2"], ["a", "b"], {"q1": ["a", "c"], "q2": ["c", "d"]})
    (found, first_missing), (again, second_missing) = list(relevant[0]), list(relevant[1])
    assert found == 0 and first_missing < -1 and again == first_missing != second_missing < -1
    assert relevant[0] == {found: 1.0, first_missing: 1.0}
    assert "2 relevant document(s) in the qrels are not in the corpus (e.g. 'c')" in caplog.text
    metrics = retrieval_metrics(np.array([[0.9, 0.1], [0.5, 0.4]]), relevant)
    assert metrics["recall@10"] == pytest.approx((0.5 + 0.0) / 2)
    assert metrics["ndcg@10"] == pytest.approx((1 / (1 + 1 / math.log2(3)) + 0.0) / 2)


def test_spearman():
    assert spearman([0.1, 0.5, 0.3], [1, 3, 2]) == pytest.approx(1.0)
    assert spearman([0.1, 0.5, 0.3], [3, 1, 2]) == pytest.approx(-1.0)
    with pytest.raises(ValueError, match="equal-length"):
        spearman([1, 2], [1, 2, 3])


def test_equal_to_sentence_transformers_information_retrieval_evaluator():
    evaluation = pytest.importorskip("sentence_transformers.sentence_transformer.evaluation")
    rng = np.random.default_rng(0)
    num_queries, num_documents = 40, 300
    scores = rng.standard_normal((num_queries, num_documents))
    relevant = [sorted(rng.choice(num_documents, rng.integers(1, 6), replace=False).tolist()) for _ in range(num_queries)]
    query_ids, corpus_ids = [f"q{i}" for i in range(num_queries)], [f"d{i:04d}" for i in range(num_documents)]
    evaluator = evaluation.InformationRetrievalEvaluator(
        dict(zip(query_ids, ["text"] * num_queries)), dict(zip(corpus_ids, ["text"] * num_documents)),
        {q: {corpus_ids[d] for d in docs} for q, docs in zip(query_ids, relevant)})
    hits = [[{"corpus_id": corpus_ids[d], "score": float(row[d])} for d in np.argsort(-row)[:10]] for row in scores]
    expected = evaluator.compute_metrics(hits)
    ours = retrieval_metrics(scores, relevant)
    assert ours["recall@1"] == pytest.approx(expected["recall@k"][1])
    assert ours["recall@10"] == pytest.approx(expected["recall@k"][10])
    assert ours["mrr@10"] == pytest.approx(expected["mrr@k"][10])
    assert ours["ndcg@10"] == pytest.approx(expected["ndcg@k"][10])


def test_graded_relevance_is_the_gain_of_ndcg_by_hand():
    """Document 2 (grade 2) ranked second, document 0 (grade 1) first: DCG 1 + 2/log2(3) over the ideal 2 + 1/log2(3).
    A sequence is grade 1 each: binary nDCG as before."""
    scores = np.array([[0.9, 0.1, 0.5, 0.2]])
    graded = retrieval_metrics(scores, [{0: 1.0, 2: 2.0}])
    assert graded["ndcg@10"] == pytest.approx((1 + 2 / math.log2(3)) / (2 + 1 / math.log2(3)))
    assert graded["recall@1"] == 0.5 and graded["mrr@10"] == 1.0  # binary measures: a grade above 0 is relevant
    assert retrieval_metrics(scores, [{0: 1.0, 2: 1.0}]) == retrieval_metrics(scores, [[0, 2]])
    assert ndcg_per_query(scores, [{0: 1.0, 2: 2.0}])[0] == pytest.approx(graded["ndcg@10"])
    assert retrieval_metrics(scores, [{0: 1.0, 3: 0.0}])["recall@10"] == 1.0  # grade 0: judged, not relevant
    with pytest.raises(ValueError, match="no relevant document"):
        retrieval_metrics(scores, [{3: 0.0}])


def test_graded_metrics_equal_pytrec_eval():
    """BEIR's and MTEB's evaluation (pytrec_eval's ndcg_cut_10, recall_10, recall_100) on graded qrels with grade-0
    judgments, a relevant document missing from the corpus, and no ties (pytrec_eval breaks them by document id)."""
    pytrec_eval = pytest.importorskip("pytrec_eval")
    rng = np.random.default_rng(3)
    num_queries, num_documents = 50, 400
    scores = rng.standard_normal((num_queries, num_documents))
    corpus_ids = [f"d{i:04d}" for i in range(num_documents)]
    qrels = {}
    for query in range(num_queries):
        judged = rng.choice(num_documents, rng.integers(1, 9), replace=False)
        qrels[f"q{query}"] = {corpus_ids[d]: int(rng.integers(0, 4)) for d in judged}
        qrels[f"q{query}"][corpus_ids[int(np.argmax(scores[query]))]] = 3  # some found at rank 1
    qrels["q0"]["not-in-corpus"] = 2
    query_ids = [q for q, grades in qrels.items() if any(grade > 0 for grade in grades.values())]
    run = {f"q{q}": {corpus_ids[d]: float(scores[q, d]) for d in np.argsort(-scores[q])[:100]}
           for q in range(num_queries)}
    expected = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10", "recall.10,100"}).evaluate(run)
    relevant = relevant_indices(query_ids, corpus_ids,
                                {q: {d: g for d, g in qrels[q].items() if g > 0} for q in query_ids})
    ours = retrieval_metrics(scores[[int(q[1:]) for q in query_ids]], relevant, recall_at=(10, 100))
    for ours_name, theirs in (("ndcg@10", "ndcg_cut_10"), ("recall@10", "recall_10"), ("recall@100", "recall_100")):
        assert ours[ours_name] == pytest.approx(np.mean([expected[q][theirs] for q in query_ids]), abs=1e-9)
    assert len({expected[q]["ndcg_cut_10"] for q in query_ids}) > 10  # grades that differ, not all found or none


def test_top_k_is_a_stable_argsort_cut_to_k():
    rng = np.random.default_rng(0)
    scores = rng.integers(0, 5, size=(50, 40)).astype(np.float32)  # many ties
    scores[0, :5] = -np.inf  # a document excluded from a query, as retrieval_metrics marks it
    for k in (1, 3, 10, 39, 40, 100):
        np.testing.assert_array_equal(top_k(scores, k), np.argsort(-scores, axis=1, kind="stable")[:, :k])
