"""The ids and texts of an index, row by row, on disk: `texts.jsonl` plus the byte offset of each row.

texts.jsonl only ever grows: an append writes past the end that meta.json records, and the
new rows count only once meta.json (with the new offsets file) has been replaced. Bytes past
the recorded end are what a killed append left behind; the next append writes over them.
A row that continues the previous row's document (corpus.Passage.follows) says `"follows": true`; the key is
absent otherwise, so a folder written before neighbours reads as rows of documents of their own.
"""
from __future__ import annotations

import itertools
import json
import os
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

from .corpus import Passage

TEXTS_FILE = "texts.jsonl"


class TextStore:
    """Rows 0..count-1 of an index folder: `records(rows)` reads only the rows asked for.

    offsets: int64 (count + 1,), row i is texts.jsonl[offsets[i]:offsets[i + 1]].
    """

    def __init__(self, path: Path, offsets: np.ndarray):
        self.path, self.offsets = path, offsets

    @classmethod
    def of_folder(cls, folder: Path, meta: dict) -> "TextStore":
        """The rows of an index folder whose meta.json is `meta` (unchecked: folder.read_folder checks a folder
        it reads)."""
        return cls(folder / TEXTS_FILE, np.load(folder / meta["files"]["offsets"]))

    @property
    def count(self) -> int:
        return len(self.offsets) - 1

    def records(self, rows: Iterable[int]) -> list[Passage]:
        passages = []
        with open(self.path, "rb") as file:
            for row in rows:
                file.seek(int(self.offsets[row]))
                record = json.loads(file.read(int(self.offsets[row + 1] - self.offsets[row])))
                passages.append(Passage(record["id"], record["text"], record.get("follows", False)))
        return passages

    def ids(self) -> Iterator:
        """Every row's id, in order, streamed (to check new ids against)."""
        return (record["id"] for record in self.all_records())

    def texts(self) -> Iterator[str]:
        """Every row's text, in order, streamed (for BM25 over the passages)."""
        return (record["text"] for record in self.all_records())

    def any_follows(self) -> bool:
        """Whether any row continues the previous row's document, read up to the first that does."""
        return any(itertools.islice(self.follows(), 1, None))

    def follows(self) -> Iterator[bool]:
        """Every row's follows (corpus.Passage.follows), in order, streamed: only a line naming the key is parsed,
        so the rows of a corpus of records cost a read, not a JSON parse each."""
        with open(self.path, "rb") as file:
            for _ in range(self.count):
                line = file.readline()
                yield b'"follows"' in line and json.loads(line).get("follows", False)

    def all_records(self) -> Iterator[dict]:
        """Every row's {"id", "text"} in order, read sequentially (bytes past the recorded end are not rows)."""
        with open(self.path, "rb") as file:
            for _ in range(self.count):
                yield json.loads(file.readline())


def append_passages(path: Path, end: int, passages: Iterable[Passage]) -> np.ndarray:
    """Write passages to texts.jsonl from byte `end` on (over anything a killed append left there).

    Returns int64 offsets (len(passages) + 1,): where each new row starts, then the new end.
    The data is flushed to disk before returning, so meta.json may then point at it.
    """
    offsets = [end]
    with open(path, "r+b" if path.exists() else "wb") as file:
        file.seek(end)
        file.truncate()
        for passage in passages:
            record = {"id": passage.id, "text": passage.text, **({"follows": True} if passage.follows else {})}
            line = (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8")
            file.write(line)
            offsets.append(offsets[-1] + len(line))
        file.flush()
        os.fsync(file.fileno())
    return np.asarray(offsets, dtype=np.int64)
