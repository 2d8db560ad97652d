"""A passage of a corpus as adapt and `index build` read it (a list of sentences), and the store the reader spools
them to: on disk, read back by position, so a corpus larger than memory streams through (search/documents.py reads
them into it)."""
from __future__ import annotations

import hashlib
import json
import mmap
import operator
import tempfile
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass
class Passage:
    id: str
    sentences: list[str]
    title: str = ""

    @property
    def text(self) -> str:
        return " ".join(self.sentences)

    @property
    def words(self) -> int:
        return sum(len(sentence.split()) for sentence in self.sentences)


class PassageStore(Sequence):
    """Passages spooled to an unnamed temporary file as they come (a JSON line each) and read back by position.

    Memory holds 8 bytes a passage (its line's offset), not its text: ~16 MB for a million passages where the
    Passage objects would take ~2 GB. The file is made in the temporary folder (TMPDIR) and is gone with the
    store. `digest` hashes every line in order: the corpus's content, for the stage cache's keys.
    """

    def __init__(self, passages: Iterable[Passage] = ()):
        self._file = tempfile.TemporaryFile(prefix="bertforge-passages-")
        self._offsets = array("q", [0])
        self._follows = bytearray()  # a byte a passage: 1 where it continues the previous passage's document
        self._hash = hashlib.blake2b(digest_size=16)
        self._mapped: mmap.mmap | None = None
        for passage in passages:
            self.append(passage)

    def append(self, passage: Passage, follows: bool = False) -> None:
        """Spool `passage`; follows: it continues the previous passage's document (tasks/retrieval/neighbours.py),
        kept beside the lines, not in them, so the digest (the stage cache's key) is the passages' alone."""
        line = json.dumps([passage.id, passage.sentences, passage.title], ensure_ascii=False).encode() + b"\n"
        try:
            self._file.write(line)
        except OSError as error:  # the file has no name: say where it is and how to move it
            raise OSError(error.errno, f"{error.strerror} (the corpus's passages are spooled to a temporary file "
                          "there; set TMPDIR to a folder with room for about the corpus's size)",
                          tempfile.gettempdir()) from None
        self._offsets.append(self._offsets[-1] + len(line))
        self._follows.append(bool(follows) and len(self._offsets) > 2)
        self._hash.update(line)
        self._mapped = None  # the file grew: map it again on the next read

    @property
    def digest(self) -> str:
        return self._hash.hexdigest()

    @property
    def follows(self) -> np.ndarray:
        """(passages,) bool: whether each passage continues the previous one's document (read_corpus's rule)."""
        return np.frombuffer(bytes(self._follows), dtype=np.uint8).astype(bool)

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        index = operator.index(index)
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(f"passage {index} of {len(self)}")
        if self._mapped is None:
            self._file.flush()
            self._mapped = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ)
        passage_id, sentences, title = json.loads(self._mapped[self._offsets[index]:self._offsets[index + 1]])
        return Passage(passage_id, sentences, title)
