"""Passages to index, read from a file one at a time (a corpus may be larger than memory).

Two layouts, picked by extension:
- `.jsonl`: one JSON object per line, read by the rule every corpus reader here shares
  (`input_files.corpus_record`): the text under `text_field` ("text"), an optional `title` before it,
  and an id (a str or an int) under `id_field`, or with none asked for under `id` or BEIR's `_id`;
- anything else: plain text, one passage per line.
A passage without an id is "FILE_NAME:LINE" (line 1-based), so passages added later from another file keep ids
of their own.
A JSONL record may say `"follows": true`: it continues the previous record's document (the passages files
`index build` writes for a folder, pages or a table say so; tasks/retrieval/neighbours.py ranks by it); a plain text
file's lines are passages of their own.
Blank lines are skipped in both. A passage split in parts (adapt splits one past its word limit) has
parts named ID#0, ID#1, ... (`part_id`), which judgements that name ID count as ID (`whole_id`).
"""
from __future__ import annotations

import itertools
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import numpy as np

from ..input_files import corpus_record, is_jsonl, jsonl_objects, open_bytes, open_text, require_file, titled

PassageId = str | int
# Longer lines are refused, as the csv reader refuses a longer field in a classification file; a passage
# is a few hundred tokens (a few kB), so such a line is a whole document or a file without line breaks.
MAX_LINE_BYTES = 131_072
PART_ID = re.compile(r"(.+)#\d+")
ID_ADVICE = "ids must be unique: fix the corpus, or remove its ids to name passages FILE:LINE"


@dataclass(frozen=True)
class Passage:
    id: PassageId
    text: str
    follows: bool = False  # it continues the previous passage's document (a neighbour: tasks/retrieval/neighbours.py)


def part_id(passage_id: PassageId, part: int) -> str:
    """The id of part `part` (0, 1, ...) of a passage split in parts: ID#0, ID#1, ..."""
    return f"{passage_id}#{part}"


def whole_id(passage_id: PassageId) -> str:
    """The id, as text, of the passage that a part (`part_id`) was split from: ID for ID#3; any other id as text."""
    match = PART_ID.fullmatch(str(passage_id))
    return match.group(1) if match else str(passage_id)


def check_corpus_file(path: str | Path) -> Path:
    return require_file(path, "corpus", "a text file (one passage per line) or a .jsonl file")


def read_passages(path: str | Path, text_field: str = "text", id_field: str | None = None) -> Iterator[Passage]:
    """Yield the corpus's passages in file order, streamed; a JSONL record's by `corpus_record`'s rule.

    Raises ValueError naming file:line for a JSONL record without a str text, without the id asked
    for, with an id that is neither a str nor an int, or with a "follows" that is not true or false.
    """
    path = check_corpus_file(path)
    if is_jsonl(path):  # in any case: NOTES.JSONL is records to every reader
        yield from jsonl_passages(path, text_field, id_field)
        return
    # .gz / .xz too. Lines end at \n alone, as count_passages and `embed`'s rows count them: a stray \r inside a line
    # split it in two and moved every later FILE:LINE id
    with open_text(path, encoding="utf-8-sig", newline="\n") as file:
        for line_number, line in enumerate(file, start=1):
            text = line.rstrip("\r\n")
            if text.strip():
                yield Passage(f"{path.name}:{line_number}", text)


def jsonl_passages(path: Path, text_field: str, id_field: str | None) -> Iterator[Passage]:
    for line_number, record in jsonl_objects(path):
        found = corpus_record(record, f"{path}:{line_number}", text_field, id_field)
        follows = record.get("follows", False)
        if not isinstance(follows, bool):  # "false" or 1 read as true would join documents the file keeps apart
            raise ValueError(f"{path}:{line_number}: \"follows\" must be true or false (the record continues the "
                             f"previous record's document), found {json.dumps(follows)[:40]}")
        if found.text.strip():
            passage_id = f"{path.name}:{line_number}" if found.id is None else found.id
            yield Passage(passage_id, titled(found.title, found.text), follows)


def count_passages(path: str | Path) -> int:
    """Non-blank lines: the number of passages, for a progress bar's total (one quick pass, no parsing).

    Raises ValueError for a line longer than MAX_LINE_BYTES: a file that is not one passage per line.
    """
    count = 0
    with open_bytes(check_corpus_file(path)) as file:
        for line_number, line in enumerate(file, start=1):
            if len(line) > MAX_LINE_BYTES:
                raise ValueError(f"{path}:{line_number} is one line of {len(line):,} bytes: that is not one passage "
                                 "per line (a model reads the first few hundred tokens of a passage); split the text "
                                 "into passages, e.g. one paragraph or sentence per line")
            count += bool(line.strip())
    return count


def chunked(items: Iterable, size: int) -> Iterator[list]:
    """`items` in lists of `size` (the last one shorter), read as they come."""
    iterator = iter(items)
    while chunk := list(itertools.islice(iterator, size)):
        yield chunk


class UniqueIds:
    """The ids in an index so far: `check` new passages against them, then `remember` the ones kept.

    Ids are compared as every door shows them, as text: the number 0 (the Python API's default ids) and the
    text "0" (a file's "id": 0, read as text) would be two passages called "0" in /search's JSON and the CLI."""

    def __init__(self, existing: Iterable[PassageId] = ()):
        self.seen = {str(passage_id) for passage_id in existing}

    def check(self, passages: list[Passage], source: str, advice: str = ID_ADVICE) -> None:
        """Raise ValueError for an id already seen or repeated within passages; remembers nothing."""
        batch = set()
        for passage in passages:
            shown = str(passage.id)
            if shown in self.seen or shown in batch:
                raise ValueError(f"duplicate id {passage.id!r} in {source} (already in the index or earlier in the "
                                 f"corpus, as a number or as text); {advice}")
            batch.add(shown)

    def remember(self, passages: list[Passage]) -> None:
        self.seen.update(str(passage.id) for passage in passages)


def make_passages(texts: list[str], ids: Sequence[PassageId] | None, first_row: int,
                  follows: Sequence[bool] | None = None) -> list[Passage]:
    """Passages of `texts` from row `first_row` on; ValueError for ids or follows that are not one per text (a
    follows that is not a bool: a ValueError too, as a file's record says). Row 0 follows nothing."""
    if ids is None:
        ids = range(first_row, first_row + len(texts))
    elif isinstance(ids, str) or len(ids) != len(texts):
        raise ValueError(f"ids must be a list with one id per text ({len(texts)}); leave them out to number rows")
    if follows is None:
        follows = [False] * len(texts)
    elif isinstance(follows, (str, bytes)) or len(follows) != len(texts) \
            or not all(isinstance(flag, (bool, np.bool_)) for flag in follows):
        raise ValueError(f"follows must be a list of one bool per text ({len(texts)}): whether it continues the "
                         "previous text's document; leave it out for documents of their own")
    follows = [bool(flag) and row > 0 for row, flag in enumerate(follows, start=first_row)]
    return [Passage(passage_id, text, flag) for passage_id, text, flag in zip(ids, texts, follows)]
