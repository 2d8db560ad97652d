"""The index folder on disk: what it holds, how it is published, appended to, and checked when read.

    INDEX/
      meta.json         format, how the vectors are made (encoder.VectorSpec: model, fingerprint,
                        tokenizer settings, pooling, prompt, dimension), kind, count, search effort,
                        build-time recall, the names of the files below, and optionally
                        dense_weight (below 1: searches are hybrid with BM25; hybrid.py), sentence_weight
                        (above 0: the dense score mixes in each passage's best sentence; sentence_vectors.py),
                        neighbour_weight (above 0: each passage's score mixes in its best neighbour's in the same
                        document; hybrid.NeighbourMix)
      index-G.faiss     the FAISS index of generation G
      offsets-G.npy     int64 (count + 1,) byte offsets of each row in texts.jsonl
      texts.jsonl       {"id": ..., "text": ...[, "follows": true]} per row, append-only (store.py)
      sentences-G.npy, sentence_rows-G.npy   an index built with a sentence weight: its passages' sentence
                        vectors and each one's row (sentence_vectors.py), generation G as the FAISS index

meta.json is the commit point. A new folder is written in a staging folder and renamed into
place. An append writes texts past the recorded end, then index-(G+1).faiss and
offsets-(G+1).npy, then replaces meta.json in one rename, then deletes generation G: a kill at
any moment leaves either the old index or the new one, whole.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

import numpy as np

from ..atomic import published_folder, replaced_file, write_array
from ..errors import UsageError
from ..models.folder import in_fixed_order
from .ann import faiss
from .corpus import Passage
from .store import TEXTS_FILE, TextStore, append_passages

META_FILE = "meta.json"
FORMAT = "bertforge-index"
# 2: meta.json's "vectors" records the tokenizer's settings (encoder.VectorSpec.tokenizer), which a bertforge
# that reads version 1 only would fail on. Version 1 is still read (its model is checked by the fingerprint
# alone), and an index keeps the version it was built with when rows are added to it.
# 3: a pooling of several modes ("mean+cls") was concatenated in the order named, where 1 and 2 concatenated
# ST's fixed order whatever the order named (encoder.VectorSpec.from_json reads them so). Written only where the
# two differ (`format_version`), so a bertforge that reads 1 and 2 still reads every index it reads as it was built.
FORMAT_VERSION = 3
# 4: sentence vectors (sentence_vectors.py). A bertforge that reads up to 3 would search without them and add rows
# without their sentences, leaving files that no longer match: written only by a build with a sentence weight.
SENTENCES_VERSION = 4
# 5: a neighbour weight above 0 (hybrid.NeighbourMix). A bertforge that reads up to 4 would rank without neighbours,
# unlike every search here: written only while meta.json's neighbour_weight is above 0 (`versioned`), so an index
# that ranks without them is read by it as before.
NEIGHBOURS_VERSION = 5
READABLE_VERSIONS = (1, 2, 3, 4, 5)


def write_new_folder(folder: Path, meta: dict, faiss_index: faiss.Index, passages: Iterable[Passage],
                     sentences=None) -> dict:
    """Publish a new index folder (it must not exist yet); returns the meta written. sentences: the passages'
    sentence vectors (sentence_vectors.SentenceVectors), or None.

    Raises ValueError when `folder` exists, or when `passages` are not one per vector.
    """
    folder = Path(folder)
    refuse_existing_output(folder)
    # "refuse": a folder that appeared while the index was built is not written over either
    with published_folder(folder, existing="refuse") as staging:
        offsets = append_passages(staging / TEXTS_FILE, 0, passages)
        version = SENTENCES_VERSION if sentences is not None else format_version(meta["vectors"]["pooling"])
        meta = commit(staging, {**meta, "format": FORMAT, "format_version": version, "generation": 0},
                      faiss_index, offsets, sentences)
    return meta


def format_version(pooling: str) -> int:
    """The oldest format that says what an index of vectors pooled by `pooling` holds: 3 for modes named out of ST's
    fixed order (which 2 would read in that fixed order), else 2."""
    return FORMAT_VERSION if pooling != in_fixed_order(pooling) else 2


def refuse_existing_output(folder: Path, corpus: str | Path = "CORPUS") -> None:
    """Raise UsageError when `folder` exists, with the advice that fits what is there.

    Only an index is added to (`bertforge index add`); a file or another folder is the user's,
    and is never written over.
    """
    if (folder / META_FILE).is_file():
        raise UsageError(f"{folder} already exists; add to it with `bertforge index add {folder} {corpus}`, "
                         "or remove it / choose another --output to build afresh")
    if folder.exists():
        what = "a folder that is not an index" if folder.is_dir() else "a file"
        raise UsageError(f"{folder} already exists ({what}); choose a new --output for the index folder")


def append_to_folder(folder: Path, meta: dict, faiss_index: faiss.Index, passages: Iterable[Passage],
                     sentences=None) -> dict:
    """Commit `passages` (already added to `faiss_index`, whose rows now run past meta's count), and with them
    `sentences`, every row's sentence vectors (the folder's and the new rows'), where the index holds them."""
    old_offsets = np.load(folder / meta["files"]["offsets"])
    new_offsets = append_passages(folder / TEXTS_FILE, meta["texts_bytes"], passages)
    return commit(folder, meta, faiss_index, np.concatenate([old_offsets[:-1], new_offsets]), sentences)


def commit(folder: Path, meta: dict, faiss_index: faiss.Index, offsets: np.ndarray, sentences=None) -> dict:
    """Write generation G+1's index, offsets and sentence vectors, then meta.json (the commit), then drop older
    generations."""
    if len(offsets) - 1 != faiss_index.ntotal:
        raise RuntimeError(f"{len(offsets) - 1} texts for {faiss_index.ntotal} vectors")
    generation = meta["generation"] + 1
    files = {"faiss": f"index-{generation}.faiss", "offsets": f"offsets-{generation}.npy"}
    with replaced_file(folder / files["faiss"]) as temporary:
        faiss.write_index(faiss_index, str(temporary))
    write_array(folder / files["offsets"], offsets)
    if sentences is not None:
        files.update(sentences.write(folder, generation))
    meta = write_meta(folder, {**meta, "generation": generation, "count": int(faiss_index.ntotal),
                               "texts_bytes": int(offsets[-1]), "files": files})
    for pattern in ("index-*.faiss", "offsets-*.npy", "sentences-*.npy", "sentence_rows-*.npy"):
        for stale in folder.glob(pattern):
            if stale.name not in files.values():
                stale.unlink(missing_ok=True)
    return meta


def write_meta(folder: Path, meta: dict) -> dict:
    """Replace meta.json in one rename (the commit point); returns meta, at the format version its settings need
    (`versioned`). Alone, it changes a setting that needs no new files (the dense weight)."""
    meta = versioned(meta)
    with replaced_file(folder / META_FILE) as temporary:
        temporary.write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    return meta


def versioned(meta: dict) -> dict:
    """meta at NEIGHBOURS_VERSION while its neighbour_weight is above 0; back at what the folder holds otherwise
    (sentence files: SENTENCES_VERSION, else `format_version` of its pooling, named as this bertforge reads it)
    once the weight is 0 again; any other version as it is."""
    version = meta["format_version"]
    if meta.get("neighbour_weight"):
        version = max(version, NEIGHBOURS_VERSION)
    elif version == NEIGHBOURS_VERSION:
        version = SENTENCES_VERSION if "sentences" in meta["files"] else format_version(meta["vectors"]["pooling"])
    return meta if version == meta["format_version"] else {**meta, "format_version": version}


def read_folder(folder: str | Path) -> tuple[dict, faiss.Index, TextStore]:
    """(meta, faiss index, text store) of an index folder, checked to be whole and consistent.

    Raises ValueError naming what is missing, damaged or inconsistent, and what to do.
    """
    folder = Path(folder)
    rebuild = rebuild_advice(folder)
    meta_file = folder / META_FILE
    if not meta_file.is_file():
        raise ValueError(not_an_index(folder))
    try:
        meta = json.loads(meta_file.read_text(encoding="utf-8"))
        files, count, texts_bytes = meta["files"], int(meta["count"]), int(meta["texts_bytes"])
        dim = int(meta["vectors"]["dim"])
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, ValueError) as error:
        raise ValueError(f"{meta_file} is damaged ({type(error).__name__}: {error}); {rebuild}") from None
    if meta.get("format") != FORMAT or meta.get("format_version") not in READABLE_VERSIONS:
        readable = " and ".join(map(str, READABLE_VERSIONS))
        raise ValueError(f"{folder} holds format {meta.get('format')!r} version {meta.get('format_version')!r}; "
                         f"this bertforge reads {FORMAT!r} versions {readable}: {rebuild}")
    for name in (files["faiss"], files["offsets"], TEXTS_FILE):
        if not (folder / name).is_file():
            raise ValueError(f"{folder} is incomplete: {name} is missing; {rebuild}")
    faiss_index = read_index_file(folder / files["faiss"], faiss.read_index, rebuild)
    offsets = read_index_file(folder / files["offsets"], np.load, rebuild)
    problems = []
    if faiss_index.ntotal != count or faiss_index.d != dim:
        problems.append(f"{files['faiss']} holds {faiss_index.ntotal} vectors of size {faiss_index.d}, "
                        f"{META_FILE} says {count} of size {dim}")
    if offsets.shape != (count + 1,) or int(offsets[-1]) != texts_bytes:
        problems.append(f"{files['offsets']} does not match {count} texts")
    if (folder / TEXTS_FILE).stat().st_size < texts_bytes:
        problems.append(f"{TEXTS_FILE} is shorter than the {texts_bytes} bytes recorded")
    if problems:
        raise ValueError(f"{folder} is inconsistent ({'; '.join(problems)}); {rebuild}")
    return meta, faiss_index, TextStore(folder / TEXTS_FILE, offsets)


def rebuild_advice(folder: Path) -> str:
    return f"rebuild it with `bertforge index build CORPUS --output {folder}` (after moving it away)"


def not_an_index(folder: Path) -> str:
    """Why `folder` (with no meta.json) is not an index, and what to do: a build only publishes a
    whole folder, so an interrupted one is told by the OUTPUT.partial it leaves beside it."""
    interrupted = folder.with_name(folder.name + ".partial").is_dir()
    resume = "its build was interrupted: run the same `bertforge index build` again (it resumes)"
    if folder.is_file():
        return f"{folder} is a file; give an index folder (made by `bertforge index build CORPUS --output FOLDER`)"
    if not folder.exists():
        return (f"index folder {folder} does not exist; "
                + (resume if interrupted else f"build one with `bertforge index build CORPUS --output {folder}`"))
    return (f"{folder} is not a bertforge index (it has no {META_FILE}); "
            + (resume if interrupted else "give a folder made by `bertforge index build`, or rebuild this one "
               f"with `bertforge index build CORPUS --output {folder}` (after moving it away)"))


def read_index_file(path: Path, read, rebuild: str):
    """read(path), or ValueError naming the file when it is cut short or corrupt."""
    try:
        return read(str(path))
    except (RuntimeError, ValueError, OSError, EOFError) as error:
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ValueError(f"{path} is damaged: it does not read ({first_line}); {rebuild}") from None
