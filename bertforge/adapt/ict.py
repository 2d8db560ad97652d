"""Inverse Cloze Task (Lee et al. 2019): a sentence is a pseudo-query for the passage it came from.

Two uses:
- held-out evaluation (`held_out_queries`): from a seeded slice of the passages one sentence
  is cut out and becomes a query; the passage stays in the indexed corpus WITHOUT it, so the
  query's words are not there to be matched. The queries are split into dev (picks the best
  stage) and test (reported), and training never sees them.
- training pairs (`IctCollator`): each training example is a passage; the collator draws one
  of its sentences as the anchor, and the positive is the passage without that sentence most
  of the time (KEEP_PROBABILITY keeps it, as the paper does, so the encoder still learns that
  a passage containing the words is a match).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from ..embeddings.folder_vectors import with_prompt
from ..search.documents import Passage, passage_text
from ..tasks.retrieval.neighbours import continuing

if TYPE_CHECKING:  # mining reads the query candidates from here
    from ..tasks.retrieval.baselines import Bm25Statistics
    from .mining import HardNegatives

MIN_QUERY_WORDS = 5  # "Oh!" is not a query anyone could answer
MIN_SENTENCES = 3  # a held-out passage keeps at least two sentences after the cut
KEEP_PROBABILITY = 0.1


class EditedPassages(Sequence):
    """`passages` with a few replaced by position, the others read from `passages` as they are (not copied: a big
    corpus stays in its PassageStore)."""

    def __init__(self, passages: Sequence[Passage], replaced: dict[int, Passage]):
        self.passages, self.replaced = passages, replaced

    def __len__(self) -> int:
        return len(self.passages)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        return self.replaced[index] if index in self.replaced else self.passages[index]


class IndexedTexts(Sequence):
    """What is indexed and encoded for each passage of `passages` (`passage_text`), made when asked for."""

    def __init__(self, passages: Sequence[Passage]):
        self.passages = passages

    def __len__(self) -> int:
        return len(self.passages)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [passage_text(p) for p in self.passages[index]]
        return passage_text(self.passages[index])


@dataclass
class HeldOut:
    """The indexed corpus (held-out passages without their cut sentence), the ICT queries, and the passages
    the queries are scored against (`scored`: all of them, or on a big corpus the queries' own passages and
    a seeded sample of the others; see held_out_queries)."""

    corpus: Sequence[Passage]
    queries: dict[str, list[tuple[str, int]]]  # split -> [(query text, index of its passage in corpus)]
    scored: list[int] | None = None  # indices into corpus, ascending; None: every passage
    follows: np.ndarray | None = None  # (corpus,) bool: each passage continues the previous one's document

    def scored_follows(self) -> np.ndarray | None:
        """Whether each scored passage continues the document of the scored passage before it
        (tasks/retrieval/neighbours.py), None where the corpus says nothing of its documents."""
        return None if self.follows is None else continuing(self.follows, self.scored_indices())

    def texts(self) -> IndexedTexts:
        return IndexedTexts(self.corpus)

    def scored_indices(self) -> list[int]:
        return list(range(len(self.corpus))) if self.scored is None else self.scored

    def scored_texts(self) -> list[str]:
        """What each evaluation embeds and ranks: the scored passages, in corpus order."""
        return [passage_text(self.corpus[i]) for i in self.scored_indices()]


def query_candidates(passage: Passage) -> list[int]:
    return [i for i, s in enumerate(passage.sentences) if len(s.split()) >= MIN_QUERY_WORDS]


def held_out_queries(passages: Sequence[Passage], count: int, rng: np.random.Generator,
                     dev_share: float = 0.5, max_scored: int | None = None, follows: np.ndarray | None = None
                     ) -> HeldOut:
    """Cut one sentence from each of `count` passages (those with >= MIN_SENTENCES sentences) drawn by rng.

    Returns the corpus in the passages' order with those sentences removed, and the queries
    split into "dev" and "test" (dev_share of them in dev). Fewer passages qualify: fewer queries.
    max_scored: when the corpus has more passages, the queries are scored against their own passages and
    others drawn by rng up to this many (every evaluation embeds them all: on a big corpus that would cost
    more than the training it measures); the base and every stage are scored against the same ones.
    """
    eligible = [i for i, p in enumerate(passages) if len(p.sentences) >= MIN_SENTENCES and query_candidates(p)]
    chosen = sorted(rng.choice(eligible, size=min(count, len(eligible)), replace=False).tolist()) if eligible else []
    corpus = EditedPassages(passages, {})
    queries = []
    for index in chosen:
        passage = passages[index]
        cut = int(rng.choice(query_candidates(passage)))
        rest = passage.sentences[:cut] + passage.sentences[cut + 1:]
        corpus.replaced[index] = Passage(passage.id, rest, passage.title)
        queries.append((passage.sentences[cut], index))
    order = rng.permutation(len(queries))
    dev_size = int(round(len(queries) * dev_share))
    return HeldOut(corpus, {"dev": [queries[i] for i in order[:dev_size]],
                            "test": [queries[i] for i in order[dev_size:]]},
                   scored_passages(len(corpus), chosen, max_scored, rng), follows)


def scored_passages(size: int, queried: list[int], max_scored: int | None, rng: np.random.Generator
                    ) -> list[int] | None:
    """None (every passage) up to max_scored; else the queried passages and a sample of the rest, ascending."""
    if max_scored is None or size <= max_scored:
        return None
    others = np.setdiff1d(np.arange(size), queried)
    drawn = rng.choice(others, size=max(0, max_scored - len(queried)), replace=False)
    return sorted({*queried, *drawn.tolist()})


def training_passages(corpus: Sequence[Passage]) -> list[int]:
    """Indices of the passages ICT can train on: a query sentence and something left beside it."""
    return [i for i, p in enumerate(corpus) if len(p.sentences) >= 2 and query_candidates(p)]


def ict_pair(passage: Passage, rng: np.random.Generator, keep_probability: float = KEEP_PROBABILITY
             ) -> tuple[str, str, int]:
    """(sentence, its context, the sentence's index): the context lacks the sentence unless rng keeps it."""
    cut = int(rng.choice(query_candidates(passage)))
    keep = rng.random() < keep_probability
    sentences = passage.sentences if keep else passage.sentences[:cut] + passage.sentences[cut + 1:]
    return passage.sentences[cut], passage_text(Passage(passage.id, sentences, passage.title)), cut


class IctCollator:
    """Passage indices -> the BiEncoder's forward arguments for (sentence, context[, hard negative]).

    The sentence drawn from a passage depends on (seed, the batch's indices): a resumed run
    rebuilds the batch it would have had. negatives.of(passage, sentence): the corpus index of a
    mined hard negative for that sentence (mining.HardNegatives), or None for in-batch negatives only.
    generated: {corpus index: queries a generator wrote for it} (pseudo_queries.py): for generated_share of
    those passages' examples the anchor is one of them and the positive the whole passage (nothing was cut from
    it); the hard negative is then the one mined for a sentence of the passage.
    lexical: BM25 statistics of the corpus; each batch then carries the anchors' BM25 scores against its positives
    (`lexical_teacher`, for the teacher term's distill_lexical), of the texts as written.
    prompt: the model's default prompt, put before every anchor, positive and negative (`with_prompt`, counted in
    the length limits) as adapt's scoring, `index build` and `search` put it before queries and passages alike.
    """

    def __init__(self, corpus: Sequence[Passage], examples: list[int], tokenizer, max_length: int,
                 query_max_length: int = 64, seed: int = 0, negatives: HardNegatives | None = None,
                 keep_probability: float = KEEP_PROBABILITY, generated: dict[int, list[str]] | None = None,
                 generated_share: float = 0.0, lexical: Bm25Statistics | None = None, prompt: str = ""):
        self.corpus, self.examples, self.tokenizer = corpus, examples, tokenizer
        self.max_length, self.query_max_length, self.seed = max_length, query_max_length, seed
        self.negatives, self.keep_probability = negatives, keep_probability
        self.generated, self.generated_share = generated or {}, generated_share
        self.lexical, self.prompt = lexical, prompt

    def __len__(self) -> int:
        return len(self.examples)

    def __call__(self, indices: list[int]) -> dict[str, torch.Tensor]:
        rng = np.random.default_rng([self.seed, *indices])
        anchors, positives, negatives = [], [], []
        for index in indices:
            passage_index = self.examples[index]
            passage = self.corpus[passage_index]
            queries = self.generated.get(passage_index)
            # Without generated queries no extra number is drawn: ICT's batches stay what they were
            if queries and self.generated_share and rng.random() < self.generated_share:
                sentence, context = queries[int(rng.integers(len(queries)))], passage_text(passage)
                cut = int(rng.choice(query_candidates(passage)))  # whose mined negative the query borrows
            else:
                sentence, context, cut = ict_pair(passage, rng, self.keep_probability)
            anchors.append(sentence)
            positives.append(context)
            if self.negatives is not None:
                negatives.append(passage_text(self.corpus[self.negatives.of(passage_index, cut)]))
        batch = self.encode("anchor", anchors, self.query_max_length)
        batch.update(self.encode("positive", positives, self.max_length))
        if self.negatives is not None:
            batch.update(self.encode("negative", negatives, self.max_length))
        if self.lexical is not None:
            batch["lexical_teacher"] = torch.from_numpy(self.lexical.scores(anchors, positives))
        return batch

    def encode(self, name: str, texts: list[str], max_length: int) -> dict[str, torch.Tensor]:
        encoded = self.tokenizer([with_prompt(self.prompt, text) for text in texts], truncation=True,
                                 max_length=max_length, padding=True, return_tensors="pt")
        return {f"{name}_input_ids": encoded["input_ids"], f"{name}_attention_mask": encoded["attention_mask"]}
