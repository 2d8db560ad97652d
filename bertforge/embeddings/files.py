"""A text file's sentence vectors into one .npy array, in parts that survive a kill and split across ranks.

The texts are cut into parts of `part_texts` texts. Each part's vectors are written as their
own .npy file, atomically, into a hidden folder beside the output (`.NAME.npy.parts/`), with a
manifest of what is being computed; the output itself is written at the end, also atomically.
So a run killed at any point (even SIGKILL) leaves the old output or none, never a truncated
one, and running the same command again reuses the finished parts (a different input or
different settings start over). Under torchrun, rank r computes parts r, r + W, r + 2W, ...
on its own device and rank 0 assembles them in input order.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

from ..atomic import replaced_file, write_array
from ..models.folder import ModelFolder, model_fingerprint, read_model_folder
from ..progress import progress_bar
from ..train.distributed import Topology, barrier
from .embed import Embedder

PART_TEXTS = 16384  # ~25 MB of MiniLM vectors per part: a few seconds of GPU work, minutes of CPU


def npy_path(output: str | Path) -> Path:
    """The path np.save really writes: `.npy` is added when the name lacks it."""
    output = Path(output)
    return output if output.suffix == ".npy" else output.with_name(output.name + ".npy")


def parts_folder(output: Path) -> Path:
    return output.with_name(f".{output.name}.parts")


def part_file(folder: Path, index: int) -> Path:
    return folder / f"part-{index:06d}.npy"


def vector_settings(source: Path, text_field: str, model_folder: str | Path | ModelFolder, embedder: Embedder) -> dict:
    """What the vectors of a file depend on: the input as it is on disk, the model and every vector choice.

    The model is its folder and its weights' fingerprint (`models.folder.model_fingerprint`), as an index build
    records it: a model retrained in place under the same folder does not reuse the old model's parts.
    """
    folder = model_folder if isinstance(model_folder, ModelFolder) else read_model_folder(model_folder)
    stat = source.stat()
    return {"input": str(source.resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns,
            "text_field": text_field, "model": str(Path(folder.root).resolve()),
            "model_fingerprint": model_fingerprint(folder.transformer), "layers": list(embedder.layers),
            "layer_combine": embedder.layer_combine, "pooling": embedder.pooling, "normalize": embedder.normalize,
            # a text past max_batch_tokens is cut there (engine.batching.fit_to_budget): the length it is read at
            "max_length": min(embedder.max_length, embedder.max_batch_tokens), "dtype": str(embedder.dtype),
            **({"prompt": embedder.prompt} if embedder.prompt else {})}


def embed_file(texts: list[str], output: str | Path, embedder: Embedder, settings: dict,
               topology: Topology = Topology(), part_texts: int | None = None) -> tuple[Path, int]:
    """Embed texts into the .npy file at output (in input order); returns (the path written, parts reused).

    settings: what the vectors depend on (input fingerprint, model, layers, pooling...): parts
    left by an earlier run are reused only when its settings were the same.
    Every rank calls this with the same texts and settings; rank 0 writes the output.
    part_texts: texts per part (default PART_TEXTS).
    """
    part_texts = part_texts or PART_TEXTS
    output = npy_path(output)
    folder = parts_folder(output)
    manifest = {"settings": settings, "texts": len(texts), "part_texts": part_texts, "dim": embedder.dim}
    if topology.is_main:
        start_or_resume(folder, manifest)
    barrier(topology)  # the other ranks start once the folder is right
    num_parts = -(-len(texts) // part_texts)
    mine = range(topology.rank, num_parts, topology.world_size)
    todo = [i for i in mine if not part_is_whole(folder, i, part_rows(i, len(texts), part_texts), embedder.dim)]
    reused = len(mine) - len(todo)
    # As index build shows it (bertforge.progress: on a terminal, and in a log every 30 s), moving a batch at a time
    # (on_rows), not a part at a time
    with progress_bar(total=sum(part_rows(i, len(texts), part_texts) for i in todo), unit="text", desc="embedding",
                      disable=not (topology.is_main and todo)) as bar:
        for index in todo:
            vectors = embedder.encode(texts[index * part_texts:(index + 1) * part_texts], on_rows=bar.update)
            write_array(part_file(folder, index), vectors)
    barrier(topology)  # every part is on disk
    if topology.is_main:
        assemble(folder, num_parts, output, len(texts), embedder.dim)
        shutil.rmtree(folder, ignore_errors=True)
    return output, reused


def start_or_resume(folder: Path, manifest: dict) -> None:
    """Keep the parts folder when it was made for the same work, else make it anew."""
    manifest_file = folder / "manifest.json"
    if manifest_file.is_file():
        try:
            if json.loads(manifest_file.read_text(encoding="utf-8")) == manifest:
                return
        except ValueError:  # unreadable: made by something else; start over
            pass
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    with replaced_file(manifest_file) as temporary:
        temporary.write_text(json.dumps(manifest, indent=1, sort_keys=True), encoding="utf-8")


def part_rows(index: int, num_texts: int, part_texts: int) -> int:
    return min(part_texts, num_texts - index * part_texts)


def part_is_whole(folder: Path, index: int, rows: int, dim: int) -> bool:
    """A part counts as done only when its file reads back with the expected shape."""
    try:
        return np.load(part_file(folder, index), mmap_mode="r").shape == (rows, dim)
    except (OSError, ValueError):
        return False


def assemble(folder: Path, num_parts: int, output: Path, num_texts: int, dim: int) -> None:
    """Concatenate the parts, in order, into output through a memory map (the array never sits in memory)."""
    if num_texts == 0:  # numpy cannot map zero bytes
        write_array(output, np.zeros((0, dim), dtype=np.float32))
        return
    with replaced_file(output) as temporary:
        merged = np.lib.format.open_memmap(temporary, mode="w+", dtype=np.float32, shape=(num_texts, dim))
        row = 0
        for index in range(num_parts):
            part = np.load(part_file(folder, index), mmap_mode="r")
            merged[row:row + len(part)] = part
            row += len(part)
        merged.flush()
        del merged
