"""`Index`: texts embedded with a BERT model, searchable by meaning (FAISS underneath).

    index = Index.build(texts, "minilm")           # or Index.load("my-index")
    index.add(more_texts)
    hits = index.search("a query", top_k=10)         # [Hit(id, text, score, row), ...] best first
    hits = index.search("a query", dense_weight=0.7) # hybrid: fused with BM25 over the passages (hybrid.py)
    index = Index.build(texts, sentence_weight=0.5)  # the dense score mixes in each passage's best sentence
    index = Index.build(texts, follows=flags, neighbour_weight=0.3)  # and each one's best neighbour's
    index.save("my-index")                           # a new folder, or commit the additions to its own

A corpus file larger than memory is built with `build.build_index`, chunk by chunk.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import torch

from ..embeddings.embed import check_texts
from ..errors import UsageError
from ..tasks.retrieval.baselines import bm25_index
from ..validation import checked
from . import ann
from .ann import faiss
from .corpus import Passage, PassageId, UniqueIds, make_passages
from .encoder import VectorSpec, open_model
from .folder import append_to_folder, read_folder, rebuild_advice, write_meta, write_new_folder
from .hybrid import NeighbourWeight, Ranked, check_dense_weight, check_weight, hybrid_top_k
from .sentence_vectors import SentenceVectors, SentenceWeight, dense_top_k
from .store import TextStore

logger = logging.getLogger(__name__)


@dataclass
class Hit:
    id: PassageId
    text: str
    score: float          # inner product (cosine for normalised vectors); in a hybrid search the fused score
    row: int              # the row in the index, 0-based, in the order texts were added
    rerank_score: float | None = None
    dense_score: float | None = None    # a hybrid search's parts: the inner product
    lexical_score: float | None = None  # and the BM25 score


class Index(SentenceWeight, NeighbourWeight):
    """Vectors of passages in a FAISS index, with the passages' ids and texts and the model that made them.

    Rows are numbered in the order passages were added. Committed rows are read from the
    index folder on demand; rows added since the last save are held in memory until `save`.
    meta["dense_weight"] below 1 makes searches hybrid (hybrid.py), meta["sentence_weight"] above 0 mixes in sentences,
    meta["neighbour_weight"] above 0 each passage's neighbours in its document (hybrid.NeighbourWeight).
    """

    def __init__(self, spec: VectorSpec, faiss_index: faiss.Index, kind: str, meta: dict | None = None,
                 folder: Path | None = None, store: TextStore | None = None):
        self.spec, self.faiss_index, self.kind = spec, faiss_index, kind
        self.meta = meta or {}
        self.folder, self.store = folder, store
        self.saved_meta = dict(self.meta) if folder is not None else None  # what the folder's meta.json holds
        self.pending: list[Passage] = []
        self.sentences: SentenceVectors | None = None  # committed and pending rows' sentence vectors, where held
        self._embedder = None
        self.device = None  # where the embedder runs: None picks as every command does (engine/devices.py)
        self._bm25 = None  # BM25 over every row's text: built by the first hybrid search, dropped by add
        self._follows: np.ndarray | None = None  # each row's Passage.follows: read when first needed, kept by add
        self._ids: UniqueIds | None = None
        self._gpu: faiss.Index | None | bool = False  # False: not made yet; None: no GPU to use

    def __len__(self) -> int:
        return int(self.faiss_index.ntotal)

    # --- making one --------------------------------------------------------------------------

    @classmethod
    def build(cls, texts: Sequence[str], model: str | Path = "minilm", *, ids: Sequence[PassageId] | None = None,
              kind: str = "auto", pooling: str | None = None, normalize: bool = True, batch_size: int = 32,
              progress: bool | None = None, tune_queries: Sequence[str] | None = None,
              dense_weight: float | None = None, device: str | torch.device | None = None,
              sentence_weight: float | None = None, neighbour_weight: float | None = None,
              follows: Sequence[bool] | None = None) -> "Index":
        """Embed texts with `model` (a checkpoint folder or packaged name) and index them.

        ids: one per text (str or int), default the row numbers. kind: auto, flat, ivf or hnsw
        (see ann.py). pooling: None takes a sentence-transformers folder's choice, else mean.
        tune_queries: typical query texts to tune an approximate index's effort on.
        dense_weight: the index's default for `search` (see set_dense_weight); None: vectors alone.
        device: where the model runs: cpu, cuda, cuda:N; None or "auto": the GPU if there is one.
        sentence_weight: above 0, passages' sentences are embedded too, for searches (set_sentence_weight).
        neighbour_weight: searches mix each passage's score with its best neighbour's (set_neighbour_weight).
        follows: one bool per text: it continues the previous text's document (the first's is ignored); None: every
        text is a document of its own.
        Raises ValueError for no texts, a non-str text, ids or follows of the wrong length, ids repeated, a
        weight outside 0..1, or a dense_weight below 1 without bm25s installed.
        """
        texts = check_texts(texts)
        if not texts:
            raise ValueError("no texts to index; pass a non-empty list of texts")
        dense_weight = check_dense_weight(dense_weight)  # before the slow part, embedding
        sentence_weight = check_weight("sentence_weight", sentence_weight)
        neighbour_weight = check_weight("neighbour_weight", neighbour_weight)
        passages = make_passages(texts, ids, first_row=0, follows=follows)
        spec, embedder = open_model(model, pooling=pooling, normalize=normalize, batch_size=batch_size,
                                    progress=progress, device=device)
        query_vectors = embedder.encode(check_texts(tune_queries)) if tune_queries else None
        index = cls.from_vectors(spec, embedder.encode(texts), passages, kind, tune_queries=query_vectors)
        index._embedder = embedder
        index.set_dense_weight(dense_weight)
        index.set_neighbour_weight(neighbour_weight or None)
        if sentence_weight:
            index.sentences = SentenceVectors.embed(embedder, texts, first_row=0)
            index.set_sentence_weight(sentence_weight)
        return index

    @classmethod
    def from_vectors(cls, spec: VectorSpec, vectors: np.ndarray, passages: Sequence[Passage],
                     kind: str = "auto", seed: int = 0, tune_queries: np.ndarray | None = None) -> "Index":
        """An index over precomputed vectors (n, spec.dim), one passage per row.

        For an approximate kind the search effort is tuned here to recall@10 >= RECALL_TARGET,
        on tune_queries (vectors (m, dim) of typical queries) or else on sampled stored vectors.
        """
        vectors = check_vectors(vectors, spec.dim)
        if len(passages) != len(vectors):
            raise ValueError(f"{len(passages)} passages for {len(vectors)} vectors; give one per vector")
        if not len(vectors):
            raise ValueError("no vectors to index; an index needs at least one passage")
        kind = ann.resolve_kind(kind, len(vectors))
        faiss_index = ann.new_faiss_index(kind, spec.dim, len(vectors))
        rng = np.random.default_rng(seed)
        training = ann.training_rows(faiss_index, len(vectors), rng)
        if training is not None:
            faiss_index.train(vectors[training])
        faiss_index.add(vectors)
        index = cls(spec, faiss_index, kind, meta={"vectors": spec.to_json(), "kind": kind})
        index.ids.check(passages, "the passages given")
        index.ids.remember(passages)
        index.pending = list(passages)
        if tune_queries is not None:
            tune_queries = check_vectors(tune_queries, spec.dim)
        index.meta.update(ann.measure_recall(faiss_index, kind, [vectors], rng, queries=tune_queries))
        return index

    @classmethod
    def load(cls, folder: str | Path, model: str | Path | None = None,
             device: str | torch.device | None = None) -> "Index":
        """Open an index folder; with `model`, queries are embedded by it after checking it is the index's model.

        device: where queries are embedded, as in `build`. Raises ValueError for a missing, half-written,
        damaged or inconsistent folder, or a model that is not the one the index was built with
        (`VectorSpec.check_same_model`).
        """
        meta, faiss_index, store = read_folder(folder)
        spec = VectorSpec.from_json(meta["vectors"], meta["format_version"])
        # the pooling as this bertforge names it, should the meta be written again (rows added, or a copy saved)
        meta = {**meta, "vectors": {**meta["vectors"], "pooling": spec.pooling}}
        index = cls(spec, faiss_index, meta["kind"], meta=meta, folder=Path(folder), store=store)
        ann.set_effort(faiss_index, index.kind, meta.get("effort"))
        index.sentences = SentenceVectors.read(Path(folder), meta, rebuild_advice(Path(folder)))
        index.device = device
        if model is not None:  # now, so that a wrong model is refused before any work
            index._embedder = spec.embedder(model, device=device)
        return index

    # --- adding and saving -------------------------------------------------------------------

    @property
    def ids(self) -> UniqueIds:
        """Every id in the index (read from disk once, when first needed)."""
        if self._ids is None:
            self._ids = UniqueIds(self.row_ids())
        return self._ids

    def row_ids(self) -> Iterator[PassageId]:
        """Every row's id in row order (committed rows streamed from the folder, then the rows added since)."""
        yield from self.store.ids() if self.store is not None else ()
        yield from (passage.id for passage in self.pending)

    def add(self, texts: Sequence[str], ids: Sequence[PassageId] | None = None,
            follows: Sequence[bool] | None = None) -> None:
        """Embed and append texts (ids default to their row numbers), and their sentences where the index holds
        some (SentenceWeight); kept in memory until `save`. follows: as `build`'s, the first text's as well (it may
        continue the index's last row's document).

        Raises ValueError for no texts, a non-str text, follows of the wrong length, or an id already in the index.
        """
        texts = check_texts(texts)
        if not texts:
            raise ValueError("no texts to add; pass a non-empty list of texts")
        passages = make_passages(texts, ids, first_row=len(self), follows=follows)
        self.ids.check(passages, "the texts added")  # before the slow part, embedding
        sentences = self.new_sentences(self.embedder, texts, first_row=len(self))
        self.add_vectors(self.embedder.encode(texts), passages, sentences)

    def add_vectors(self, vectors: np.ndarray, passages: Sequence[Passage],
                    sentences: SentenceVectors | None = None) -> None:
        """Append precomputed vectors (n, dim) made by this index's model, one passage per row, and (an index that
        holds sentence vectors) their sentences' (SentenceVectors.embed)."""
        vectors = check_vectors(vectors, self.spec.dim)
        if len(passages) != len(vectors):
            raise ValueError(f"{len(passages)} passages for {len(vectors)} vectors; give one per vector")
        self.ids.check(passages, "the passages added")
        self.check_new_sentences(sentences, len(self), len(passages))
        self.faiss_index.add(vectors)
        if sentences is not None:
            self.sentences.extend(sentences)
        self._gpu = False  # the replica is stale
        self._bm25 = None  # and so is BM25 (its document frequencies change too): rebuilt on the next hybrid search
        self.extend_follows(passages)
        self.ids.remember(passages)
        self.pending.extend(passages)

    def save(self, folder: str | Path | None = None) -> Path:
        """Write a new index folder, or (no folder, or the one it was loaded from) commit the rows added since.

        Raises ValueError when `folder` is another path that already exists.
        """
        target = Path(folder) if folder is not None else self.folder
        if target is None:
            raise ValueError("this index has no folder yet; pass one: index.save('my-index')")
        if self.folder is not None and target.resolve() == self.folder.resolve():
            if self.pending:
                self.meta = append_to_folder(target, self.meta, self.faiss_index, self.pending, self.sentences)
            elif self.meta != self.saved_meta:  # a setting changed (set_dense_weight): meta.json alone
                self.meta = write_meta(target, self.meta)
        else:
            committed = self.store.records(range(self.store.count)) if self.store is not None else []
            self.meta = write_new_folder(target, self.meta, self.faiss_index, [*committed, *self.pending],
                                         self.sentences)
        self.folder, self.saved_meta = target, dict(self.meta)
        self.store = TextStore.of_folder(target, self.meta)
        self.pending = []
        if self.sentences is not None:  # read back from the folder: the pending ones leave memory, as the texts do
            self.sentences = SentenceVectors.read(target, self.meta, rebuild_advice(target))
        return target

    # --- searching ---------------------------------------------------------------------------

    def set_effort(self, effort: int) -> None:
        """Search harder (or faster) than tuned at build: nprobe for ivf, efSearch for hnsw.

        The build tunes on stored vectors as queries; queries unlike the passages (short
        questions, say) may need more. Raises ValueError for a flat index or effort < 1.
        """
        ann.set_effort(self.faiss_index, self.kind, ann.check_effort(self.kind, effort))
        self._gpu = False

    @property
    def dense_weight(self) -> float:
        """The dense share a search uses by default: meta.json's dense_weight; 1 (vectors alone) where it has none."""
        weight = self.meta.get("dense_weight")
        return 1.0 if weight is None else float(weight)

    def set_dense_weight(self, dense_weight: float | None) -> None:
        """Make searches hybrid by default with this dense share (0..1; None or 1: vectors alone).

        Kept in meta.json: `save()` commits it (rewriting meta.json alone when no rows were added).
        Raises UsageError outside 0..1, ValueError for a weight below 1 without bm25s installed.
        """
        dense_weight = check_dense_weight(dense_weight)
        if dense_weight is None:
            self.meta.pop("dense_weight", None)
        else:
            self.meta["dense_weight"] = dense_weight

    def bm25(self):
        """A bm25s index of every row's text (committed, then added) in row order: built on the first
        hybrid search and kept (docs/search.md: its cost); `add` drops it."""
        if self._bm25 is None:
            committed = self.store.texts() if self.store is not None else ()
            self._bm25 = bm25_index([*committed, *(passage.text for passage in self.pending)])
        return self._bm25

    def searcher(self) -> faiss.Index:
        """The index to search: a GPU replica where FAISS has a GPU (ann.gpu_replica), else the CPU index."""
        if self._gpu is False:
            self._gpu = ann.gpu_replica(self.faiss_index, self.kind)
        return self._gpu if self._gpu is not None else self.faiss_index

    @property
    def embedder(self):
        if self._embedder is None:
            self._embedder = self.spec.embedder(device=self.device)
        return self._embedder

    def search(self, queries: str | Sequence[str] | np.ndarray, top_k: int = 10, *,
               dense_weight: float | None = None, sentence_weight: float | None = None,
               neighbour_weight: float | None = None) -> list[Hit] | list[list[Hit]]:
        """The top_k passages nearest each query, best first.

        queries: one str (returns [Hit, ...]), a list of str, or vectors (n, dim) / (dim,) made
        by the index's model (returns one list per query). top_k larger than the index returns
        every passage. A query longer than the model's max_length is truncated, with a warning.
        dense_weight: 1 ranks by the vectors alone; below 1 by `fuse` of the cosines and BM25
        over the passages (hybrid.py: which rows are scored), Hit.score the fused score and
        Hit.dense_score / lexical_score its parts; queries must then be texts. None: the index's
        (`dense_weight`, from meta.json). sentence_weight: above 0 the dense score mixes in each passage's best
        sentence (sentence_vectors.py); None: the index's. neighbour_weight: above 0 the score (the fused one
        in a hybrid search) mixes in each passage's best neighbour's in its document (hybrid.NeighbourWeight; None:
        the index's). Raises ValueError for top_k < 1, vectors of the wrong size, a weight outside 0..1, vectors
        with a dense weight below 1, a hybrid search without bm25s installed, or a sentence weight above 0 on an
        index without sentence vectors.
        """
        checked("top_k", top_k)
        weight = self.dense_weight if dense_weight is None else checked("dense_weight", dense_weight, float)
        sentence_weight = check_weight("sentence_weight", sentence_weight)
        self.sentence_mix(sentence_weight)  # refused before the queries are embedded
        neighbour_weight = check_weight("neighbour_weight", neighbour_weight)
        single = isinstance(queries, str) or (isinstance(queries, np.ndarray) and queries.ndim == 1)
        if isinstance(queries, np.ndarray) and weight < 1.0:
            raise UsageError(f"a hybrid search (dense_weight {weight:g}) needs query texts, for BM25; "
                             "pass texts, or dense_weight=1.0 to search by vectors alone")
        queries = [queries] if isinstance(queries, str) else queries
        queries = queries if isinstance(queries, np.ndarray) else check_texts(queries)  # a generator read once
        results = self.hits(self.rank(self.query_vectors(queries), queries, top_k, weight, None, sentence_weight,
                                      neighbour_weight))
        return results[0] if single else results

    def rank(self, vectors: np.ndarray, texts: Sequence[str], top_k: int, dense_weight: float,
             exclude: Sequence | None = None, sentence_weight: float | None = None,
             neighbour_weight: float | None = None) -> Ranked:
        """The top_k rows of each query, as `search` ranks them: vectors (queries, dim) of the queries, texts their
        texts (for BM25; unused at weight 1). Inputs are trusted: `search` checks them; a caller that ranks the
        same queries at several weights (weights.py) embeds them once. exclude[q]: rows (an array, or None) query
        q never ranks: below weight 1 they set no bound of the fusion's normalisation (hybrid_top_k) and come
        last; the caller drops them from the rows, at weight 1 too. sentence_weight, neighbour_weight: None, the
        index's. At neighbour weight 0, or on an index whose rows follow none, the ranking is the one without."""
        mix, neighbours = self.sentence_mix(sentence_weight), self.neighbour_mix(neighbour_weight)
        if dense_weight < 1.0:
            return hybrid_top_k(self.faiss_index, self.kind, self.searcher(), self.bm25(), vectors, texts, top_k,
                                dense_weight, exclude, mix, neighbours)
        if mix is not None or neighbours is not None:  # every row of a small flat index mixed, else FAISS's pool
            return dense_top_k(self.faiss_index, self.kind, self.searcher(), vectors, top_k, mix, neighbours, exclude)
        scores, rows = self.searcher().search(vectors, min(top_k, len(self)))
        # Equal scores in corpus order, as `tasks.retrieval.metrics.top_k` and the hybrid ranking break ties
        # (FAISS put the later row first): the same duplicate passage ranked the same way at every weight.
        order = np.lexsort((rows, -scores), axis=-1)
        return Ranked(np.take_along_axis(rows, order, axis=-1), np.take_along_axis(scores, order, axis=-1), None, None)

    def hits(self, ranked: Ranked) -> list[list[Hit]]:
        """One list of Hits per query, the passages read once for all queries; rows -1 (none found) left out."""
        wanted = sorted({int(row) for row in ranked.rows.ravel() if row >= 0})
        passages = dict(zip(wanted, self.passages(wanted)))
        results = []
        for query, rows in enumerate(ranked.rows):
            hits = []
            for column, row in enumerate(rows):
                if row < 0:
                    continue
                hit = Hit(passages[int(row)].id, passages[int(row)].text, float(ranked.scores[query, column]), int(row))
                if ranked.dense is not None:
                    hit.dense_score = float(ranked.dense[query, column])
                    hit.lexical_score = float(ranked.lexical[query, column])
                hits.append(hit)
            results.append(hits)
        return results

    def query_vectors(self, queries) -> np.ndarray:
        if isinstance(queries, np.ndarray):
            return check_vectors(queries.reshape(1, -1) if queries.ndim == 1 else queries, self.spec.dim)
        texts = check_texts(queries)
        if not texts:
            raise ValueError("no queries given; pass a query text")
        self.warn_if_truncated(texts)
        return self.embedder.encode(texts)

    def warn_if_truncated(self, texts: list[str]) -> None:
        limit = self.embedder.max_length
        for text in texts:
            length = self.embedder.token_count(text)
            if length > limit:
                logger.warning("a query of %d tokens is longer than the model's limit of %d; only its first %d "
                               "tokens are searched for", length, limit, limit)

    def passages(self, rows: Sequence[int]) -> list[Passage]:
        """The (id, text) of each row: committed rows from the folder, rows added since from memory."""
        committed = self.store.count if self.store is not None else 0
        on_disk = [row for row in rows if row < committed]
        found = dict(zip(on_disk, self.store.records(on_disk))) if on_disk else {}
        return [found[row] if row < committed else self.pending[row - committed] for row in rows]


def check_vectors(vectors, dim: int) -> np.ndarray:
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    if vectors.ndim != 2 or vectors.shape[1] != dim:
        raise ValueError(f"vectors of shape {vectors.shape} do not fit this index: it holds vectors of size {dim} "
                         "(shape (n, dim))")
    return vectors
