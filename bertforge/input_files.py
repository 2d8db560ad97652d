"""Opening the user's input files: checked paths, compressed text read transparently, UTF-8 problems located.

Every reader of user files goes through `require_file` (a folder given for a file and a missing
file get different messages) and `open_text` (.gz and .xz read as text, so the project can ship
its demo corpus compressed); `utf8_problem` finds the line of the first byte that is not UTF-8,
for a message that names the file and the line, not a byte offset inside a read buffer.
"""
from __future__ import annotations

import codecs
import gzip
import lzma
import os
from pathlib import Path
from typing import IO

COMPRESSED = {".gz": gzip.open, ".xz": lzma.open}


def require_file(path: str | os.PathLike, what: str = "input file") -> Path:
    """`path` as a Path when it is an existing file; ValueError saying what is wrong otherwise."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{what} {path} is a folder; pass a file")
    if not path.is_file():
        raise ValueError(f"{what} {path} does not exist; check the path (relative paths start at {Path.cwd()})")
    return path


def text_suffix(path: str | os.PathLike) -> str:
    """The suffix that says what the text is: `.txt` for both `a.txt` and `a.txt.gz`."""
    path = Path(path)
    return Path(path.stem).suffix if path.suffix in COMPRESSED else path.suffix


def open_text(path: str | os.PathLike, encoding: str = "utf-8", newline: str | None = None) -> IO[str]:
    """Open a text file for reading, decompressing .gz / .xz on the fly; lines end in \\n
    (newline="" keeps them as they are, which the csv module wants)."""
    opener = COMPRESSED.get(Path(path).suffix)
    if opener is not None:
        return opener(path, "rt", encoding=encoding, newline=newline)
    return open(path, encoding=encoding, newline=newline)


def open_bytes(path: str | os.PathLike) -> IO[bytes]:
    opener = COMPRESSED.get(Path(path).suffix, open)
    return opener(path, "rb")


def utf8_problem(path: str | os.PathLike, chunk_size: int = 1 << 20) -> str | None:
    """"line N, byte 0xE9" for the first bytes of `path` that are not UTF-8; None when it all decodes.

    Streams the file (a multi-GB notes file is never held whole); a UTF-8 byte-order mark is fine.
    """
    decoder = codecs.getincrementaldecoder("utf-8")()
    line = 1
    with open_bytes(path) as file:
        while chunk := file.read(chunk_size):
            try:
                decoder.decode(chunk)
            except UnicodeDecodeError as error:
                # error.object is what the decoder saw: this chunk after the (newline-free) tail it held back.
                line += error.object.count(b"\n", 0, error.start)
                return f"line {line}, byte 0x{error.object[error.start]:02X}"
            line += chunk.count(b"\n")
        try:
            decoder.decode(b"", final=True)
        except UnicodeDecodeError:
            return f"line {line}, a multi-byte character cut off at the end of the file"
    return None


def fingerprints(paths) -> list[dict]:
    """What a cache built from `paths` records about them: path, size and modification time."""
    records = []
    for path in map(Path, paths):
        stat = path.stat()
        records.append({"path": str(path.resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns})
    return records


def changed_inputs(recorded: list[dict] | None, paths) -> str | None:
    """How the files `paths` differ from the fingerprints a cache recorded (None: the same files, unchanged).

    A cache that recorded none (made by an older bertforge) counts as changed: it cannot be checked.
    """
    if not recorded:
        return "the cache does not record which files it was made from"
    current = fingerprints(paths)
    before, now = [r["path"] for r in recorded], [r["path"] for r in current]
    if before != now:
        added, removed = sorted(set(now) - set(before)), sorted(set(before) - set(now))
        parts = ([f"added {', '.join(added)}"] if added else []) + ([f"removed {', '.join(removed)}"] if removed else [])
        return "; ".join(parts) or "the files are listed in another order"
    for old, new in zip(recorded, current):
        if (old["size"], old["mtime_ns"]) != (new["size"], new["mtime_ns"]):
            return f"{new['path']} changed (size {old['size']:,} -> {new['size']:,} bytes, or a newer modification time)"
    return None
