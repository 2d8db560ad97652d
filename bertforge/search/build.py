"""Build an index from a corpus file, or add one to an index, chunk by chunk, resumable after a kill.

The corpus is read as a stream and embedded CHUNK_SIZE passages at a time; each chunk's
vectors go to `OUTPUT.partial/chunk-NNNNNN.npy` (written whole or not at all) before the next
is started. Run the same command again after a kill and the chunks already there are kept,
provided `job.json` there still matches (same corpus file, size and time, same model and
pooling, same chunk size); otherwise they are discarded, with a message. The passages
themselves are never held in memory for a build: the texts are copied from the corpus into
the index folder in a second pass, and the vectors are read back from the chunk files.
With a sentence weight (or an add to an index that holds sentence vectors) each chunk's sentence vectors and their
rows go beside it, `sentences-NNNNNN.npy` and `sentence_rows-NNNNNN.npy`, written before the chunk's own file (so a
chunk file found has its sentences), and the job records that it embeds them.

A folder, pages (HTML, Markdown, reStructuredText) or a CSV / TSV table are read as adapt reads them
(search/documents.py: a passage per blank-line block or row, markup gone, duplicates dropped, ~150 words at most,
split to fit the index model's length in word pieces as adapt fits its base's: `TokenLimit.of_embedder`) and their
passages written to `OUTPUT.passages.jsonl` first, which the build then reads as above; a rerun that finds the same
passages there keeps the file, and so the chunks made from it. A text or JSONL file's passages are taken as given
(a JSONL record's "follows" too: search/corpus.py), and the passages file says which passage follows which.
"""
from __future__ import annotations

import filecmp
import functools
import json
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from ..embeddings.embed import Embedder
from ..atomic import replaced_file, write_array
from ..errors import UsageError
from ..progress import progress_bar
from ..input_files import require_file
from . import ann
from .corpus import ID_ADVICE, UniqueIds, check_corpus_file, chunked, count_passages, read_passages
from .documents import (corpus_summary, no_text_found, read_corpus, reads_as_documents, text_digest,
                        write_passages_file)
from .encoder import open_model
from .folder import format_version, refuse_existing_output, write_new_folder
from .hybrid import check_dense_weight, check_weight
from .ann import gather_rows, measure_recall
from .index import Index
from .sentence_vectors import SentenceVectors
from .token_limit import TokenLimit

logger = logging.getLogger(__name__)

CHUNK_SIZE = 10_000
JOB_FILE = "job.json"


class ChunkFiles:
    """A corpus's vectors, one .npy file per chunk of passages, in a work folder tied to one job."""

    def __init__(self, work: Path, job: dict, chunk_size: int):
        self.work, self.chunk_size = work, chunk_size
        self.sentences = bool(job.get("sentences"))  # each chunk's sentence vectors too (the module doc)
        job_file = work / JOB_FILE
        if work.is_dir() and (not job_file.is_file() or json.loads(job_file.read_text(encoding="utf-8")) != job):
            logger.warning("discarding %s: its chunks were embedded for another corpus, model or chunk size", work)
            shutil.rmtree(work)
        work.mkdir(parents=True, exist_ok=True)
        with replaced_file(job_file) as temporary:
            temporary.write_text(json.dumps(job, indent=2), encoding="utf-8")
        self.sizes: list[int] = []

    def path(self, number: int, name: str = "chunk") -> Path:
        return self.work / f"{name}-{number:06d}.npy"

    def kept(self, number: int, chunk: list, dim: int) -> bool:
        """Whether chunk `number`'s files, from an earlier run, are whole and of this chunk."""
        path = self.path(number)
        if not path.is_file() or np.load(path, mmap_mode="r").shape != (len(chunk), dim):
            return False
        if not self.sentences:
            return True
        rows_path, vectors_path = self.path(number, "sentence_rows"), self.path(number, "sentences")
        if not (rows_path.is_file() and vectors_path.is_file()):
            return False
        rows = np.load(rows_path, mmap_mode="r")
        return len(rows) > 0 and rows[-1] == len(chunk) - 1 and np.load(vectors_path, mmap_mode="r").shape == (
            len(rows), dim)

    def write(self, number: int, chunk: list, embedder, on_rows) -> None:
        """Embed a chunk's passages (and sentences) into its files, the chunk's own last."""
        texts = [passage.text for passage in chunk]
        if self.sentences:
            (vectors, rows), = SentenceVectors.embed(embedder, texts, first_row=0).parts
            write_array(self.path(number, "sentences"), vectors)
            write_array(self.path(number, "sentence_rows"), rows)
        write_array(self.path(number), embedder.encode(texts, on_rows=on_rows))

    def embed(self, passages, embedder, total: int, ids: UniqueIds, source: str, advice: str = ID_ADVICE) -> int:
        """Embed every chunk not already on disk; check ids on the way. Returns the number of chunks reused."""
        reused = 0
        with progress_bar(total=total, unit="text", desc="embedding") as bar:
            for number, chunk in enumerate(chunked(passages, self.chunk_size)):
                ids.check(chunk, source, advice)
                ids.remember(chunk)
                if self.kept(number, chunk, embedder.dim):
                    reused += 1
                    bar.update(len(chunk))
                else:  # the bar moves a batch at a time: a chunk takes minutes on a CPU
                    self.write(number, chunk, embedder, bar.update)
                self.sizes.append(len(chunk))
        return reused

    def vectors(self) -> Iterator[np.ndarray]:
        """Each chunk's vectors (rows, dim) in corpus order, memory-mapped from its file."""
        for number in range(len(self.sizes)):
            yield np.load(self.path(number), mmap_mode="r")

    def sentence_vectors(self, first_row: int = 0) -> SentenceVectors | None:
        """Every chunk's sentence vectors, memory-mapped, their rows counted from `first_row` (None for a job
        without them)."""
        if not self.sentences:
            return None
        starts = first_row + np.cumsum([0, *self.sizes])
        return SentenceVectors([(np.load(self.path(number, "sentences"), mmap_mode="r"),
                                 np.load(self.path(number, "sentence_rows")) + starts[number])
                                for number in range(len(self.sizes))])

    def remove(self) -> None:
        shutil.rmtree(self.work, ignore_errors=True)


def corpus_job(corpus: Path, spec, chunk_size: int, text_field: str, id_field: str | None, **extra) -> dict:
    stat = corpus.stat()
    # Chunks a bertforge before format 3 embedded for the same pooling name hold its modes in another order.
    version = format_version(spec.pooling)
    return {"corpus": str(corpus.resolve()), "corpus_bytes": stat.st_size, "corpus_mtime_ns": stat.st_mtime_ns,
            "vectors": spec.to_json(), "chunk_size": chunk_size, "text_field": text_field, "id_field": id_field,
            **({"format_version": version} if version > 2 else {}), **extra}


def sentences_job(sentences: bool) -> dict:
    """What a job records of sentence vectors: that its chunks hold them (only then, so that the chunks of a job
    without them are kept as before). Any weight above 0 embeds the same sentences: a rerun with another keeps them."""
    return {"sentences": True} if sentences else {}


@dataclass(frozen=True)
class IndexInput:
    """What a build or an add reads: a file of passages (`read_passages`), its fields, and for messages the corpus
    as given and what a duplicate id means there."""

    file: Path
    text_field: str
    id_field: str | None
    name: str
    advice: str = ID_ADVICE

    def passages(self):
        return read_passages(self.file, self.text_field, self.id_field)


def index_input(corpus: str | Path, work_file: Path, text_field: str, id_field: str | None,
                embedder: Callable[[], Embedder], index: Index | None = None) -> IndexInput:
    """The corpus itself (a text file, a line a passage, or JSONL), or, for a folder, pages or a table, its passages
    as JSONL in `work_file` (the module's doc), without exact duplicates: of one another, and of the passages of
    `index` (added to), as one build of the folders together drops them. embedder: the Embedder that embeds the
    passages, called only for a folder, pages or a table (it may load the model), whose passages are split to fit it;
    a streamed file is checked without it, before the model loads."""
    source = Path(corpus)
    if source.exists() and reads_as_documents(source):
        known = indexed_digests(index) if index is not None else None
        passages = passages_file(source, work_file, TokenLimit.of_embedder(embedder()), text_column=text_field,
                                 id_column=id_field, known=known)
        return IndexInput(passages, "text", "id", str(source),
                          f"its passages are named after their files (FILE:BLOCK) unless its records give ids under "
                          f"{repr(id_field) if id_field else 'id or _id'}: is it, or a file of the same name, in the "
                          "index already?")
    return IndexInput(check_corpus_file(source), text_field, id_field, str(source))


def passages_file(source: Path, target: Path, limit: TokenLimit, text_column: str = "text",
                  text_option: str = "--text-field", id_column: str | None = None,
                  known: set[bytes] | None = None) -> Path:
    """The passages of a folder, pages or a table (`read_corpus`), each fitting `limit` (the index model's), written
    to `target` as an index's JSONL. A `target` that already holds them is left as it was, its time too: an
    interrupted build's chunks, made from it, are kept. Prints what was read and left out; raises ValueError when no
    text is found."""
    corpus = read_corpus([source], text_column=text_column, id_column=id_column, known=known, max_tokens=limit)
    print("\n".join(corpus_summary(corpus, "index build", text_option)), flush=True)
    if not corpus.passages and known and corpus.duplicates:
        raise ValueError(f"every passage of {source} is in the index already ({corpus.duplicates:,} exact duplicates "
                         "of its passages); nothing to add")
    if not corpus.passages:
        raise ValueError(no_text_found(str(source), text_option, corpus.not_text))
    fresh = target.with_name(target.name + ".new")
    write_passages_file(corpus.passages, fresh)
    if target.is_file() and filecmp.cmp(fresh, target, shallow=False):
        fresh.unlink()
    else:
        fresh.replace(target)
    return target


def indexed_digests(index: Index, block: int = 10_000) -> set[bytes]:
    """The `text_digest` of every passage an index holds, its texts read a block of rows at a time."""
    return {text_digest(passage.text) for start in range(0, len(index), block)
            for passage in index.passages(range(start, min(start + block, len(index))))}


def checked_total(corpus: Path) -> int:
    total = count_passages(corpus)
    if total == 0:
        raise ValueError(f"corpus {corpus} holds no text (it is empty or only blank lines); "
                         "give one passage per line, or JSONL with a text field")
    return total


def tune_query_texts(tune_queries: str | Path | None, kind: str) -> list[str] | None:
    """The texts of `build_index`'s tune-queries file (None without one), read before the corpus and the model."""
    if tune_queries is None:
        return None
    if kind == "flat":  # taken and never read, the user left thinking it tuned
        raise UsageError("a flat index searches exactly; it has no effort to tune (leave out --tune-queries, or "
                         "build an ivf or hnsw index)")
    require_file(tune_queries, "tune-queries file")  # read_passages would call it a corpus
    query_texts = [p.text for p in read_passages(tune_queries)]
    if not query_texts:
        raise ValueError(f"tune-queries file {tune_queries} holds no text; give one query per line")
    return query_texts


def build_index(corpus: str | Path, output: str | Path, model: str | Path = "minilm", *, kind: str = "auto",
                chunk_size: int = CHUNK_SIZE, pooling: str | None = None, normalize: bool = True,
                batch_size: int = 32, text_field: str = "text", id_field: str | None = None, seed: int = 0,
                tune_queries: str | Path | None = None, dense_weight: float | None = None, device=None,
                sentence_weight: float | None = None, neighbour_weight: float | None = None) -> dict:
    """Embed a corpus file into a new index folder at `output`; returns its meta (kind, count, recall...).

    tune_queries: a text file of typical queries, one a line, to tune an approximate index's
    effort on (default: sampled stored vectors stand in for queries). dense_weight: kept in
    meta.json as the index's default for searches (Index.set_dense_weight: below 1, hybrid with
    BM25); None, vectors alone. Raises ValueError for an existing output, a missing or empty
    corpus or queries file, a bad record, a duplicate id, an unknown kind, a dense_weight
    outside 0..1 or one below 1 without bm25s. Chunks embedded before a kill are reused (see module doc).
    device: where the passages are embedded (`engine.devices.device_from_option`: None is the GPU if there is one).
    sentence_weight: above 0, every passage's sentences are embedded too, a chunk at a time beside its vectors,
    and kept in meta.json as the index's default (Index.set_sentence_weight); None or 0: the passages alone.
    neighbour_weight: above 0, kept in meta.json as the index's default (Index.set_neighbour_weight): a passage's
    score mixes in its best neighbour's in the same document (the passages a folder's file or a long record was
    split into: a passages file's "follows"); None or 0: each passage alone.
    """
    source, output = Path(corpus), Path(output)
    refuse_existing_output(output, source)
    if kind not in ann.KINDS:
        raise UsageError(f"index kind {kind!r} is not one of {ann.KINDS}")
    dense_weight, sentence_weight = check_dense_weight(dense_weight), check_weight("sentence_weight", sentence_weight)
    neighbour_weight = check_weight("neighbour_weight", neighbour_weight)
    query_texts = tune_query_texts(tune_queries, kind)
    read_file = output.with_name(output.name + ".passages.jsonl")
    # opened once, when first asked for: by index_input for a folder (its passages are split to fit the model), else
    # after a streamed file's checks, so a mistake in it is said before the model loads
    opened = functools.cache(lambda: open_model(model, pooling=pooling, normalize=normalize, batch_size=batch_size,
                                                progress=False, device=device))
    corpus = index_input(source, read_file, text_field, id_field, lambda: opened()[1])
    total = checked_total(corpus.file)
    spec, embedder = opened()
    chunks = ChunkFiles(output.with_name(output.name + ".partial"),
                        corpus_job(corpus.file, spec, chunk_size, corpus.text_field, corpus.id_field,
                                   **sentences_job(bool(sentence_weight))), chunk_size)
    reused = chunks.embed(corpus.passages(), embedder, total, UniqueIds(), corpus.name, corpus.advice)
    if reused:
        print(f"kept {reused} chunk(s) embedded by an earlier, interrupted run")
    count = sum(chunks.sizes)
    kind = ann.resolve_kind(kind, count)
    faiss_index = ann.new_faiss_index(kind, spec.dim, count)
    rng = np.random.default_rng(seed)
    training = ann.training_rows(faiss_index, count, rng)
    if training is not None:
        faiss_index.train(gather_rows(chunks.vectors(), training))
    for vectors in chunks.vectors():
        faiss_index.add(np.ascontiguousarray(vectors))
    meta = {"vectors": spec.to_json(), "kind": kind, "corpus": str(source.resolve()),
            **({"dense_weight": dense_weight} if dense_weight is not None else {}),
            **({"sentence_weight": sentence_weight} if sentence_weight else {}),
            **({"neighbour_weight": neighbour_weight} if neighbour_weight else {}),
            **measure_recall(faiss_index, kind, chunks.vectors, rng,
                             queries=embedder.encode(query_texts) if query_texts and kind != "flat" else None)}
    meta = write_new_folder(output, meta, faiss_index, corpus.passages(), chunks.sentence_vectors())
    chunks.remove()
    read_file.unlink(missing_ok=True)
    return meta


def add_corpus(folder: str | Path, corpus: str | Path, model: str | Path | None = None, *,
               chunk_size: int = CHUNK_SIZE, batch_size: int = 32, text_field: str = "text",
               id_field: str | None = None, device=None) -> tuple[dict, int]:
    """Append a corpus file's passages to an index folder (committed at the end, all or nothing); (meta, added).

    The new passages are held in memory until the commit; a kill keeps the chunks embedded
    so far in FOLDER.adding/. Raises ValueError as `build_index` does, and for a model that is
    not the index's. device: as in `build_index`.
    """
    folder = Path(folder)
    index = Index.load(folder, model=model, device=device)
    read_file = folder.with_name(folder.name + ".adding.passages.jsonl")
    # the index's own model: a folder's passages are split to fit it, its new vectors must be the index's
    corpus = index_input(corpus, read_file, text_field, id_field, lambda: index.embedder, index)
    total = checked_total(corpus.file)
    embedder = index.embedder
    embedder.progress, embedder.batch_size = False, batch_size
    job = corpus_job(corpus.file, index.spec, chunk_size, corpus.text_field, corpus.id_field,
                     index_generation=index.meta["generation"], **sentences_job(index.sentences is not None))
    chunks = ChunkFiles(folder.with_name(folder.name + ".adding"), job, chunk_size)
    chunks.embed(corpus.passages(), embedder, total, index.ids, corpus.name, corpus.advice)
    if chunks.sentences:  # before the rows are added: theirs are counted from the index's end
        index.sentences.extend(chunks.sentence_vectors(first_row=len(index)))
    for vectors, chunk in zip(chunks.vectors(), chunked(corpus.passages(), chunk_size)):
        index.faiss_index.add(np.ascontiguousarray(vectors))
        index.pending.extend(chunk)
    added = len(index.pending)
    index.save()
    chunks.remove()
    read_file.unlink(missing_ok=True)
    return index.meta, added
