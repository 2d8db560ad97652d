"""Score a stage (or BM25, or the base model) on the held-out ICT queries and, optionally, a BEIR folder.

Every scorer is `tasks.retrieval.evaluation`'s: (queries, documents) -> similarity matrix, so
BM25, the base model and each adapted stage are measured by the same metrics on the same
queries: nDCG@10, recall@10/100, MRR@10 (and recall@1). Every encoder is also measured fused with
BM25 (tasks/retrieval/hybrid.py), at the dense weight its dev queries pick: that pair is what the
index serves.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from ..embeddings.similarity import l2_normalized
from ..tasks.retrieval.baselines import bm25_scores
from ..tasks.retrieval.evaluation import (RememberedVectors, Scorer, encoder_embedder, encoder_scorer,
                                          evaluate_retrieval)
from ..tasks.retrieval.hybrid import WEIGHTS, best_weight, hybrid_scorer, remembered
from ..tasks.retrieval.metrics import ndcg_per_query, retrieval_metrics
from ..tasks.retrieval.neighbours import NEIGHBOUR_WEIGHTS, neighbour_mixed
from ..tasks.retrieval.reader import RetrievalSet, beir_qrels, read_retrieval_set
from ..tasks.retrieval.sentences import (SENTENCE_WEIGHTS, mixed, score_parts, sentence_owners,
                                         simplest_within_one_se)
from .ict import HeldOut
from .stages import stage_key

RECALL_AT = (1, 10, 100)
METRICS = ("ndcg@10", "recall@10", "recall@100", "mrr@10")
# What picks a stage's best checkpoint during training: the dev nDCG@10 of the model fused with BM25 at its best
# weight, as the index ranks. Its own name: ndcg@10 is the model alone, as `sbert train` logs it (eval_ndcg@10)
HYBRID_METRIC = "hybrid_ndcg@10"
# How every set is scored, in the evaluation digest: a change of rule scores a finished run's cached stages again, as a
# change of the BEIR set's files does. 2 (2026-11-28): a query that is also a document is left out before the fusion
# normalises (tasks.retrieval.hybrid.fuse), not after; the drug reviews' fused numbers moved (base + BM25 at 0.5:
# 0.311 -> 0.266). 3 (2026-11-28): each encoder also scored with its passages' best sentences mixed in
# (tasks/retrieval/sentences.py), the engine the index serves; a digest without a BEIR set carries the rule too.
# 4 (2026-11-28): that engine's pair of weights picked by the one-standard-error rule (sentences.simplest_within_one_se)
# 5 (2026-11-28): and each passage's best neighbour in its document mixed in (tasks/retrieval/neighbours.py)
# 6 (2026-11-28): a BEIR set's graded qrels give nDCG their grades as gains, as BEIR's pytrec_eval does (binary before)
SCORING_RULE = 6


def ict_metrics(scorer: Scorer, held_out: HeldOut) -> dict[str, dict[str, float]]:
    """{"dev": metrics, "test": metrics}: every split's queries scored against the one indexed corpus (its scored
    passages: on a big corpus a sample, HeldOut.scored)."""
    splits = [split for split, queries in held_out.queries.items() if queries]
    texts = [query for split in splits for query, _ in held_out.queries[split]]
    scores = scorer(texts, held_out.scored_texts())  # (queries of all splits, passages): passages encoded once
    results, start = {}, 0
    for split in splits:
        relevant = relevant_columns(held_out, split)
        results[split] = retrieval_metrics(scores[start:start + len(relevant)], relevant, recall_at=RECALL_AT)
        start += len(relevant)
    return results


def relevant_columns(held_out: HeldOut, split: str) -> list[list[int]]:
    """Each of a split's queries' relevant passage (the one its sentence was cut from) as a column of the scored
    passages (`HeldOut.scored_texts`' order)."""
    column = {passage: position for position, passage in enumerate(held_out.scored_indices())}
    return [[column[passage]] for _, passage in held_out.queries[split]]


def read_beir_folder(folder: str | Path) -> RetrievalSet:
    """A BEIR folder: corpus.jsonl, queries.jsonl and qrels/test.tsv (BEIR's own layout; dev.tsv where it has no
    test split: `beir_qrels`) or qrels.tsv (what `bertforge sbert prepare` writes). Raises ValueError naming what is
    missing."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"--eval {folder} is not a folder; give a BEIR folder (corpus.jsonl, queries.jsonl, "
                         "qrels/test.tsv)")
    return read_retrieval_set(folder / "queries.jsonl", folder / "corpus.jsonl", beir_qrels(folder))


def evaluation_digest(beir: RetrievalSet | None) -> str:
    """How a stage was scored, as a short digest: the scoring rule (SCORING_RULE) and the BEIR set's content, if
    any. A stage is scored again when its record's digest differs: when the set's files change, whatever their path
    (the path alone kept a cut-down set's stale numbers), or how sets are scored."""
    if beir is None:
        return stage_key(SCORING_RULE)
    return stage_key(SCORING_RULE, beir.query_ids, beir.queries, beir.corpus_ids, beir.corpus, beir.relevant)


class Evaluator:
    """Scores a model (or BM25) on the held-out ICT queries and, when given, a BEIR set."""

    def __init__(self, held_out: HeldOut, tokenizer, beir: RetrievalSet | None = None, batch_size: int = 64,
                 lexical: Scorer | None = None):
        self.held_out, self.tokenizer, self.beir, self.batch_size = held_out, tokenizer, beir, batch_size
        self.lexical = lexical or remembered(bm25_scores)  # BM25: the baseline row and every hybrid's other half
        self.eval_key = evaluation_digest(beir)  # what every record says it was scored by and on

    def with_tokenizer(self, tokenizer) -> "Evaluator":
        """The same queries, scoring models that read text with `tokenizer` (a stage that grew the vocabulary)."""
        return Evaluator(self.held_out, tokenizer, self.beir, self.batch_size, self.lexical)

    def scorer(self, model) -> Scorer:
        """The model's cosines, each distinct text embedded once per scorer (the model must not train meanwhile)."""
        return encoder_scorer(self.vectors(model))

    def vectors(self, model) -> RememberedVectors:
        """The model's vectors, each distinct text embedded once (the model must not train meanwhile)."""
        return RememberedVectors(encoder_embedder(model, self.tokenizer, batch_size=self.batch_size, progress=False))

    def everything(self, scorer: Scorer, held_out: dict[str, dict[str, float]] | None = None
                   ) -> dict[str, dict[str, float]]:
        """{"dev", "test"[, "beir"]: metrics} for one scorer (held_out: its ict_metrics, when already made)."""
        results = dict(held_out) if held_out is not None else ict_metrics(scorer, self.held_out)
        if self.beir is not None:
            results["beir"] = self.beir_metrics(scorer)
        return results

    def encoder(self, model) -> dict:
        """{"metrics": the model alone, "passage_hybrid": the model fused with BM25 at its best weight, "hybrid": the
        same with each passage's best sentence and best neighbour mixed in at the weights picked (`served_engine`;
        what the index serves)} on every evaluation set, "held_out_seconds": what ranking the held-out queries took, which is
        what an evaluation during training costs (the time budget prices those by it), and "sentence_seconds":
        what embedding their passages' sentences took (the index embeds every passage's)."""
        vectors = self.vectors(model)
        dense = remembered(encoder_scorer(vectors))  # each text list is embedded once, whatever the weights tried
        started = time.perf_counter()
        held_out = ict_metrics(dense, self.held_out)  # embeds the held-out queries and passages, remembered
        held_out_seconds = time.perf_counter() - started
        started = time.perf_counter()
        vectors.encode(sentence_owners(self.held_out.scored_texts())[0])  # remembered for the weights below
        sentence_seconds = time.perf_counter() - started
        # each passage's cosine and best sentence's, once per query and document list, mixed at every weight tried
        parts = remembered(score_parts(lambda texts: l2_normalized(vectors.encode(texts))))

        def dense_at(sentence_weight: float) -> Scorer:
            return lambda queries, documents: mixed(*parts(queries, documents), sentence_weight)

        return {"metrics": self.everything(dense, held_out), "passage_hybrid": self.hybrid(dense),
                "hybrid": self.served_engine(dense_at), "held_out_seconds": held_out_seconds,
                "sentence_seconds": sentence_seconds, "eval_key": self.eval_key}

    def hybrid(self, dense: Scorer) -> dict:
        """{"dense_weight", "metrics"}: `dense` fused with BM25 at its best weight on the dev queries, scored on
        every set at that weight."""
        weight = self.best_weight(dense)
        return {"dense_weight": weight, "metrics": self.everything(hybrid_scorer(dense, self.lexical, weight))}

    def served_engine(self, dense_at: Callable[[float], Scorer]) -> dict:
        """{"sentence_weight", "dense_weight", "neighbour_weight", "metrics"}: the engine's settings the dev queries
        pick (tasks/retrieval/sentences.py's share of each passage's best sentence, the fusion's dense share, and
        tasks/retrieval/neighbours.py's share of its best neighbour), scored on every set with them: what the index
        serves. dense_at(w): the model's scorer at sentence weight w. The pick is the simplest settings within one
        standard error of the best (`sentences.simplest_within_one_se`: ICT queries favour BM25 and sentences more
        than real ones)."""
        texts = [query for query, _ in self.held_out.queries["dev"]]
        relevant = relevant_columns(self.held_out, "dev")
        follows = self.held_out.scored_follows()
        neighbour_weights = NEIGHBOUR_WEIGHTS if follows is not None and follows.any() else (0.0,)
        per_query, documents = {}, self.held_out.scored_texts()
        for sentence in SENTENCE_WEIGHTS:
            for weight in WEIGHTS:
                fused = hybrid_scorer(dense_at(sentence), self.lexical, weight)(texts, documents)
                for neighbour in neighbour_weights:
                    per_query[sentence, weight, neighbour] = ndcg_per_query(
                        neighbour_mixed(fused, follows, neighbour), relevant)
        sentence, weight, neighbour = simplest_within_one_se(per_query)
        fused = hybrid_scorer(dense_at(sentence), self.lexical, weight)
        return {"sentence_weight": sentence, "dense_weight": weight, "neighbour_weight": neighbour,
                "metrics": self.everything(fused, ict_metrics(self.with_neighbours(fused, neighbour), self.held_out))}

    def with_neighbours(self, scorer: Scorer, neighbour_weight: float) -> Scorer:
        """`scorer` of the held-out queries against the held-out passages, each passage's best neighbour's score
        mixed in (tasks/retrieval/neighbours.py). Only for those passages: a BEIR set's documents are records,
        documents of their own, which have no neighbours (search/documents.py reads a .jsonl so)."""
        follows = self.held_out.scored_follows()

        def scores(queries, documents):
            return neighbour_mixed(scorer(queries, documents), follows, neighbour_weight)

        return scores

    def best_weight(self, dense: Scorer) -> float:
        """The dense weight at which `dense` fused with BM25 ranks the dev queries best (ties: the larger)."""
        def dev(weight: float) -> float:
            return ict_metrics(hybrid_scorer(dense, self.lexical, weight), self.held_out)["dev"]["ndcg@10"]

        return best_weight({weight: dev(weight) for weight in WEIGHTS})

    def beir_metrics(self, scorer: Scorer) -> dict[str, float]:
        return evaluate_retrieval(scorer, self.beir, recall_at=RECALL_AT)

    def during_training(self, model) -> dict[str, float]:
        """What the loop sees at each evaluation: HYBRID_METRIC, the dev nDCG@10 of the model fused with BM25 at its
        best weight, as the index will rank (the loop keeps the checkpoint best by it), and its test one; beside
        them ndcg@10 and test_ndcg@10, the model alone's (retrieval_metrics' meaning, as `sbert train` logs it)."""
        dense = remembered(self.scorer(model))
        alone = ict_metrics(dense, self.held_out)
        fused = ict_metrics(hybrid_scorer(dense, self.lexical, self.best_weight(dense)), self.held_out)
        return {HYBRID_METRIC: fused["dev"]["ndcg@10"], "hybrid_test_ndcg@10": fused["test"]["ndcg@10"],
                "ndcg@10": alone["dev"]["ndcg@10"], "test_ndcg@10": alone["test"]["ndcg@10"]}
