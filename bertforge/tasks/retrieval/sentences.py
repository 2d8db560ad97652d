"""A passage scored by its best sentence as well as by its own vector.

One vector per passage averages its sentences; a query that matches one sentence well (a question answered in one
line of a paragraph, a sentence of a novel whose neighbours are the passage) is diluted by the rest. So the dense
score can mix in the passage's best sentence (a max over sentence vectors, as late-interaction retrievers take a
max over token vectors, at sentence grain):

    dense(q, p) = (1 - w) * cos(q, p) + w * max over sentences s of p of cos(q, s)

w is the sentence weight (0: the passage vector alone). Measured with all-MiniLM-L6-v2 zero-shot on adapt's
held-out ICT queries, w = 0.5, the model alone (nDCG@10 dev / test): *Emma* 0.086 / 0.100 -> 0.095 / 0.123, drug
reviews 0.149 / 0.120 -> 0.171 / 0.146, Python's FAQ 0.445 / 0.441 -> 0.483 / 0.470; the best sentence alone (w = 1)
is no better than the passage, the mean of the sentences much worse (drug reviews' adapted model, ICT test 0.166 ->
0.092): the mix is what pays. `mixed` is the one place the rule lives: adapt measures and picks w with it, the
search index ranks with it.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from ..pretraining.corpus import sentences_of
from .evaluation import Scorer

SENTENCE_WEIGHTS = (0.0, 0.25, 0.5, 0.75)  # the grid adapt picks from on its dev queries


def simplicity(settings: tuple[float, ...]) -> tuple[float, float, float]:
    """How simple an engine's settings are, smaller first: (sentence weight, dense weight[, neighbour weight]) ->
    (neighbour weight, sentence weight, -dense weight): the fewest neighbours (tasks/retrieval/neighbours.py), then
    the fewest sentences (no sentence vectors needed), then the least BM25 (hybrid.best_weight's tie rule)."""
    sentence, dense, *neighbour = settings
    return (neighbour[0] if neighbour else 0.0, sentence, -dense)


def best_weights(scores: Mapping[tuple[float, ...], float]) -> tuple[float, ...]:
    """The settings (sentence weight, dense weight[, neighbour weight]) of the highest score ({settings: e.g. dev
    nDCG@10}); ties go to the simplest (`simplicity`). adapt picks its index's settings by this rule, `bertforge
    index weight --tune` an existing index's."""
    return max(scores, key=lambda settings: (scores[settings], *(-part for part in simplicity(settings))))


def simplest_within_one_se(per_query: Mapping[tuple[float, ...], np.ndarray]) -> tuple[float, ...]:
    """The settings (sentence weight, dense weight[, neighbour weight]) adapt serves: of those whose per-query
    scores ({settings: (queries,) nDCG@10}, the same queries for every one) are within one standard error of the
    best's (`best_weights` of the means; the error of the paired differences), the simplest (`simplicity`: the
    fewest neighbours, then sentences, then BM25): the one-standard-error rule (Breiman et al. 1984), the simplest
    model the queries cannot tell from the best.

    Why: adapt's dev queries are ICT sentences cut from the corpus, which share their neighbours' words, so they
    favour both BM25 and the best sentence more than people's questions do. Picked at the best dev mean, Python's
    FAQ's trained model served sentences 0.75 and BM25 0.3 (its 175 real questions 0.725), where 0.25 and 0.1 rank
    them at 0.780 (2026-11-28)."""
    means = {settings: float(np.mean(scores)) for settings, scores in per_query.items()}
    best = best_weights(means)

    def within(settings: tuple[float, ...]) -> bool:
        differences = np.asarray(per_query[settings]) - np.asarray(per_query[best])
        error = differences.std(ddof=1) / np.sqrt(len(differences)) if len(differences) > 1 else 0.0
        return differences.mean() >= -error

    return min((settings for settings in per_query if within(settings)), key=simplicity)


def passage_sentences(text: str) -> list[str]:
    """The sentences a passage is scored by: the corpus reader's split (`sentences_of`, which adapt and `index build`
    read passages with), the whole text where it gives none (a passage is never without a sentence)."""
    return sentences_of(text) or [text]


def sentence_owners(texts: Sequence[str]) -> tuple[list[str], np.ndarray]:
    """(every passage's sentences in passage order, the passage number of each), the owners ascending."""
    sentences, owners = [], []
    for number, text in enumerate(texts):
        split = passage_sentences(text)
        sentences += split
        owners += [number] * len(split)
    return sentences, np.asarray(owners, dtype=np.int64)


def best_sentence_scores(query_vectors: np.ndarray, sentence_vectors: np.ndarray, owners: np.ndarray,
                         passages: int) -> np.ndarray:
    """(queries, passages): each passage's highest inner product over its sentences. owners: each sentence's
    passage number, ascending, every passage 0..passages-1 owning at least one sentence."""
    starts = np.flatnonzero(np.r_[True, owners[1:] != owners[:-1]])
    if len(starts) != passages or owners[0] != 0 or owners[-1] != passages - 1:
        raise ValueError(f"sentences of {len(starts)} passages given for {passages}; every passage needs one")
    return np.maximum.reduceat(query_vectors @ sentence_vectors.T, starts, axis=1)


def mixed(passage_scores: np.ndarray, sentence_scores: np.ndarray | None, sentence_weight: float) -> np.ndarray:
    """The dense score: (1 - w) * the passage's cosine + w * its best sentence's (the module doc); at w = 0 the
    passage's alone (sentence_scores may be None)."""
    if sentence_weight == 0:
        return passage_scores
    return (1 - sentence_weight) * passage_scores + sentence_weight * sentence_scores


def sentence_scorer(embed: Callable[[list[str]], np.ndarray], sentence_weight: float) -> Scorer:
    """A scorer (tasks.retrieval.evaluation) ranking by `mixed`, with `embed` (texts -> normalised vectors: a
    RememberedVectors' encode, so a text is embedded once whatever the weights tried)."""
    parts = score_parts(embed, sentences=sentence_weight != 0)

    def scores(queries: Sequence[str], documents: Sequence[str]) -> np.ndarray:
        return mixed(*parts(queries, documents), sentence_weight)

    return scores


def score_parts(embed: Callable[[list[str]], np.ndarray], sentences: bool = True
                ) -> Callable[[Sequence[str], Sequence[str]], tuple[np.ndarray, np.ndarray | None]]:
    """(queries, documents) -> (each passage's cosine, its best sentence's; None without `sentences`): what `mixed`
    mixes, so that several sentence weights are scored from one split and one pass over the sentences
    (`hybrid.remembered` keeps the pair per query and document list)."""

    def parts(queries: Sequence[str], documents: Sequence[str]) -> tuple[np.ndarray, np.ndarray | None]:
        query_vectors = embed(list(queries))
        passage_scores = query_vectors @ embed(list(documents)).T
        if not sentences:
            return passage_scores, None
        split, owners = sentence_owners(documents)
        return passage_scores, best_sentence_scores(query_vectors, embed(split), owners, len(documents))

    return parts
