"""An index's sentence vectors, and the dense score that mixes in each passage's best sentence.

The rule and the split into sentences are tasks/retrieval/sentences.py's (`passage_sentences`, `sentence_owners`,
`best_sentence_scores`, `mixed`): this module only stores the vectors and picks which rows are scored. Every
passage's sentences are embedded by the index's own embedder (its prompt, pooling and normalisation), in passage
order, so each passage's sentences are one run of the arrays:

    sentences-G.npy       float32 (n_sentences, dim)
    sentence_rows-G.npy   int64 (n_sentences,): each sentence's row, ascending, every row owning at least one

both of generation G, named in meta.json's "files" and committed with the FAISS index (folder.commit). An index
holds them when it was built with a sentence weight (meta.json's sentence_weight); rows added embed theirs too.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..atomic import append_array, replaced_file
from ..errors import UsageError
from ..tasks.retrieval.metrics import left_out, top_k as best_columns
from ..tasks.retrieval.sentences import best_sentence_scores, mixed, sentence_owners
from . import ann, hybrid
from .ann import faiss
from .hybrid import Ranked

FILES = {"sentences": "sentences-{}.npy", "sentence_rows": "sentence_rows-{}.npy"}


def no_sentences(weight: float) -> UsageError:
    """The refusal of a sentence weight above 0 on an index that holds no sentence vectors."""
    return UsageError(f"this index holds no sentence vectors, so it cannot rank by sentence weight {weight:g}; "
                      "rebuild it with `bertforge index build ... --sentence-weight W`")


class SentenceVectors:
    """Sentence vectors and their rows, in parts (one per build chunk or add, ascending rows): written to the folder
    part by part, joined in memory only when a search scores them."""

    def __init__(self, parts: list[tuple[np.ndarray, np.ndarray]] | None = None):
        self.parts = list(parts or [])
        self._joined: tuple[np.ndarray, np.ndarray] | None = None

    @classmethod
    def embed(cls, embedder, texts: list[str], first_row: int) -> "SentenceVectors":
        """The sentences of `texts` (rows first_row...) embedded by `embedder`, as it embeds the passages."""
        sentences, owners = sentence_owners(texts)
        return cls([(embedder.encode(sentences), owners + first_row)])

    def extend(self, other: "SentenceVectors") -> None:
        self.parts += other.parts
        self._joined = None

    def joined(self) -> tuple[np.ndarray, np.ndarray]:
        """(vectors, rows) of every sentence; one part (a loaded index's) is used as it is, memory-mapped."""
        if self._joined is None:
            parts = self.parts or [(np.zeros((0, 0), np.float32), np.zeros(0, np.int64))]
            self._joined = parts[0] if len(parts) == 1 else tuple(np.concatenate(p) for p in zip(*parts))
        return self._joined

    def write(self, folder: Path, generation: int) -> dict:
        """Generation `generation`'s two files in `folder`, each written atomically, part by part; their names."""
        files = {key: name.format(generation) for key, name in FILES.items()}
        for column, key in enumerate(files):
            write_stacked(folder / files[key], [part[column] for part in self.parts])
        return files

    @classmethod
    def read(cls, folder: Path, meta: dict, rebuild: str) -> "SentenceVectors | None":
        """A folder's sentence vectors (memory-mapped), None where meta.json names none; ValueError, naming what
        and `rebuild`, for files missing or not matching the index (every row owning sentences, in order)."""
        files = meta["files"]
        if "sentences" not in files:
            if meta.get("sentence_weight"):
                raise ValueError(f"{folder} is incomplete: meta.json has a sentence_weight but names no sentence "
                                 f"files; {rebuild}")
            return None
        try:
            vectors, rows = (np.load(folder / files[key], mmap_mode="r") for key in FILES)
        except (OSError, ValueError, KeyError) as error:
            raise ValueError(f"{folder}'s sentence vectors do not read ({type(error).__name__}: {error}); "
                             f"{rebuild}") from None
        count, dim = int(meta["count"]), int(meta["vectors"]["dim"])
        steps = np.diff(rows)
        if (vectors.shape != (len(rows), dim) or rows.ndim != 1 or not len(rows) or rows[0] != 0
                or rows[-1] != count - 1 or not np.isin(steps, (0, 1)).all()):
            raise ValueError(f"{folder} is inconsistent ({files['sentences']} / {files['sentence_rows']} do not "
                             f"hold sentences of each of {count} rows in order, of size {dim}); {rebuild}")
        return cls([(vectors, rows)])


class SentenceWeight:
    """`Index`'s sentence weight and sentence vectors (Index inherits this): meta.json's sentence_weight (0 where it
    has none: the passage vectors alone), and the vectors it needs, which only a build embeds for every row."""

    meta: dict
    sentences: SentenceVectors | None

    @property
    def sentence_weight(self) -> float:
        """The sentence share of the dense score a search uses by default."""
        return float(self.meta.get("sentence_weight") or 0.0)

    def set_sentence_weight(self, sentence_weight: float | None) -> None:
        """Make searches mix in each passage's best sentence by default with this weight (0..1; None: not at all).

        Kept in meta.json as the dense weight is (`save()` rewrites meta.json alone). At 0 an index that holds
        sentence vectors keeps them (and embeds added rows' sentences), so the weight can be raised again. Raises
        UsageError outside 0..1, or above 0 on an index built without sentence vectors (they are embedded from
        every passage: a rebuild).
        """
        weight = hybrid.check_weight("sentence_weight", sentence_weight)
        self.sentence_mix(weight)  # refuses a weight the index has no vectors for
        if weight is None:
            self.meta.pop("sentence_weight", None)
        else:
            self.meta["sentence_weight"] = weight

    def sentence_mix(self, sentence_weight: float | None = None) -> SentenceMix | None:
        """The mixed dense score at `sentence_weight` (None: the index's), None at 0; UsageError above 0 on an
        index without sentence vectors."""
        weight = self.sentence_weight if sentence_weight is None else sentence_weight
        if not weight:
            return None
        if self.sentences is None:
            raise no_sentences(weight)
        return SentenceMix(self.sentences, weight)

    def new_sentences(self, embedder, texts: list[str], first_row: int) -> SentenceVectors | None:
        """The sentence vectors rows added need: texts' where the index holds sentence vectors, else None."""
        return SentenceVectors.embed(embedder, texts, first_row) if self.sentences is not None else None

    def check_new_sentences(self, sentences: SentenceVectors | None, first_row: int, count: int) -> None:
        """ValueError unless `sentences` are those of rows first_row..first_row+count-1, in order, where the index
        holds sentence vectors (and None where it holds none): a row without its sentences could never be scored."""
        if (sentences is None) != (self.sentences is None):
            raise ValueError("this index holds sentence vectors: add texts with `add`, or give the passages' "
                             "sentence vectors (SentenceVectors.embed)" if sentences is None else
                             "this index holds no sentence vectors; add the passage vectors alone")
        if sentences is not None:
            rows = sentences.joined()[1]
            if not len(rows) or not np.array_equal(np.unique(rows), np.arange(first_row, first_row + count)) \
                    or (np.diff(rows) < 0).any():
                raise ValueError(f"the sentence vectors given are not those of rows {first_row} to "
                                 f"{first_row + count - 1}, in order")


def write_stacked(target: Path, parts: list[np.ndarray]) -> None:
    """The parts stacked on their first axis as one .npy file, atomically, never all in memory at once."""
    first = parts[0]
    shape = (sum(len(part) for part in parts), *first.shape[1:])
    header = {"descr": np.lib.format.dtype_to_descr(first.dtype), "fortran_order": False, "shape": shape}
    with replaced_file(target) as temporary, open(temporary, "wb") as file:
        np.lib.format.write_array_header_1_0(file, header)
        for part in parts:
            append_array(file, np.asarray(part, dtype=first.dtype))


@dataclass
class SentenceMix:
    """The dense score of tasks/retrieval/sentences.py's `mixed` at `weight` over `sentences`' best per row."""

    sentences: SentenceVectors
    weight: float

    def every_row(self, queries: np.ndarray, passage_scores: np.ndarray) -> np.ndarray:
        """(queries, rows) mixed scores, passage_scores (queries, rows) being every row's inner product."""
        vectors, rows = self.sentences.joined()
        block = max(1, hybrid.EXACT_BLOCK_SCORES // max(1, len(rows)))  # bounds the (queries, sentences) matrix
        best = [best_sentence_scores(queries[start:start + block], vectors, rows, passage_scores.shape[1])
                for start in range(0, len(queries), block)]
        return mixed(passage_scores, np.concatenate(best), self.weight)

    def of_rows(self, query: np.ndarray, rows: np.ndarray, passage_scores: np.ndarray) -> np.ndarray:
        """(len(rows),) mixed scores of one query's `rows` (each >= 0), passage_scores their inner products."""
        if not len(rows):  # an ivf search that found nothing
            return passage_scores
        vectors, owners = self.sentences.joined()
        starts, ends = np.searchsorted(owners, rows, "left"), np.searchsorted(owners, rows, "right")
        lengths = ends - starts
        # every row's run of sentences, one after another: owners 0, 0, 1, 2, 2, ... by position in `rows`
        picked = np.arange(lengths.sum()) + np.repeat(starts - (np.cumsum(lengths) - lengths), lengths)
        local = np.repeat(np.arange(len(rows)), lengths)
        best = best_sentence_scores(query[None], vectors[picked], local, len(rows))[0]
        return mixed(passage_scores, best, self.weight)


def dense_top_k(faiss_index: faiss.Index, kind: str, searcher: faiss.Index, vectors: np.ndarray, top_k: int,
                mix: SentenceMix | None, neighbours: hybrid.NeighbourMix | None = None,
                exclude: Sequence | None = None) -> Ranked:
    """A dense-only search ranked by the mixed score (`mix`'s, or the inner product: None), mixed with `neighbours`
    (or not: None): over every row of a flat index up to EXACT_HYBRID_UP_TO (as the exact hybrid search scores),
    else over FAISS's top pool_size(top_k) rows (the passage vectors' nearest), joined by their neighbours.
    exclude[q]: rows query q never ranks (hybrid_top_k's), or None: with neighbours they score -inf, no row's
    neighbour, and come last; without, the caller drops them."""
    count = int(faiss_index.ntotal)
    k = min(top_k, count)
    if kind == "flat" and count <= hybrid.EXACT_HYBRID_UP_TO:  # each block's top k: never every query's scores
        rows, best = [], []
        for part, scores in hybrid.every_row_dense(faiss_index, vectors, mix):
            if neighbours is not None:  # the left-out rows -inf first: no row's neighbour (in place: a fresh block)
                scores = neighbours.mixed(left_out(scores, None if exclude is None else exclude[part]))
            rows.append(best_columns(scores, k))
            best.append(np.take_along_axis(scores, rows[-1], 1))
        return Ranked(np.concatenate(rows), np.concatenate(best), None, None)
    passage_scores, pools = searcher.search(vectors, hybrid.pool_size(top_k, count))
    ranked_rows = np.full((len(vectors), k), -1, np.int64)  # -1 and nan past what an ivf search found, as FAISS pads
    ranked_scores = np.full((len(vectors), k), np.nan, np.float32)
    exclude = exclude if exclude is not None else [None] * len(vectors)
    for query, (vector, pool, scores, left) in enumerate(zip(vectors, pools, passage_scores, exclude)):
        pool, scores = pooled_scores(faiss_index, kind, vector, pool, scores, mix, neighbours, left)
        order = np.lexsort((pool, -scores))[:k]  # equal scores in row order, as every other ranking here
        ranked_rows[query, :len(order)], ranked_scores[query, :len(order)] = pool[order], scores[order]
    return Ranked(ranked_rows, ranked_scores, None, None)


def pooled_scores(faiss_index: faiss.Index, kind: str, vector: np.ndarray, pool: np.ndarray, scores: np.ndarray,
                  mix: SentenceMix | None, neighbours: hybrid.NeighbourMix | None,
                  exclude: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(rows, their final dense scores) of one query's pool: FAISS's rows (-1 past what it found) and inner
    products `scores`, mixed by `mix`; with `neighbours`, the pool joined by its rows' neighbours, every one's inner
    product from the stored vectors (FAISS's cover only its own), the `exclude` rows -inf, then mixed with its best
    neighbour's."""
    found = pool >= 0  # an ivf search may find fewer
    pool, scores = pool[found], scores[found]
    if neighbours is not None:
        pool = neighbours.pool(pool)
        scores = ann.stored_vectors(faiss_index, kind, pool) @ vector
    scores = scores if mix is None else mix.of_rows(vector, pool, scores)
    if neighbours is None:
        return pool, scores
    if exclude is not None:
        scores = np.where(np.isin(pool, exclude), -np.inf, scores).astype(np.float32)
    return pool, neighbours.mixed(scores[None], pool)[0]
