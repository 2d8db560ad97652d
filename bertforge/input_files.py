"""Opening the user's input files: checked paths, compressed text read transparently, UTF-8 problems located.

Every reader of user files goes through `require_file` (a folder given for a file and a missing
file get different messages) and `open_text` (.gz and .xz read as text, so the project can ship
its demo corpus compressed); `utf8_problem` finds the line of the first byte that is not UTF-8,
for a message that names the file and the line, not a byte offset inside a read buffer;
`jsonl_objects` reads JSON Lines with errors that name file:line, and `corpus_record` one record of a corpus the
same way for every reader (its text, title and id), `open_table` CSV / TSV rows,
`blank_line_blocks` plain text by blank-line blocks, `table_texts` a table's text column, `record_texts` a JSONL
file's or a table's texts as train-tokenizer and pretraining read them, `unescaped` the HTML entities of text that
is not a page. A UTF-8 byte-order mark (a Windows editor's, many Gutenberg books') is dropped wherever text is read:
it is not part of the first word, header or record.
"""
from __future__ import annotations

import codecs
import csv
import gzip
import html
import io
import json
import lzma
import os
import zlib
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Iterator

COMPRESSED = {".gz": gzip.open, ".xz": lzma.open}
DELIMITERS = {".csv": ",", ".tsv": "\t"}
JSONL_SUFFIX = ".jsonl"


def require_file(path: str | os.PathLike, what: str = "input file", advice: str = "") -> Path:
    """`path` as a Path when it is an existing file; ValueError saying what is wrong otherwise, and `advice`
    (what the file should be) after it."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{what} {path} is a folder; pass a file{advice and f' ({advice})'}")
    if not path.is_file():
        raise ValueError(f"{what} {path} does not exist; check the path (relative paths start at {Path.cwd()})"
                         f"{advice and f'; {advice}'}")
    return path


def text_suffix(path: str | os.PathLike) -> str:
    """The suffix that says what the text is: `.txt` for both `a.txt` and `a.txt.gz`."""
    path = Path(path)
    return Path(path.stem).suffix if path.suffix in COMPRESSED else path.suffix


def is_jsonl(path: str | os.PathLike) -> bool:
    """Whether a file is read as JSON Lines: .jsonl in any case (a Windows export's NOTES.JSONL), compressed or not.
    Every corpus reader asks this, so one file is never records to one command and prose to another."""
    return text_suffix(path).lower() == JSONL_SUFFIX


def is_table(path: str | os.PathLike) -> bool:
    """Whether a file is read as a CSV / TSV table (its suffix in any case, compressed or not)."""
    return text_suffix(path).lower() in DELIMITERS


# The first bytes of every file of each compressed format.
SIGNATURES = {".gz": ("gzip", b"\x1f\x8b"), ".xz": ("xz", b"\xfd7zXZ\x00")}


def open_text(path: str | os.PathLike, encoding: str = "utf-8-sig", newline: str | None = None) -> IO[str]:
    """Open a text file for reading, decompressing .gz / .xz on the fly, a byte-order mark dropped; lines end in
    \\n (newline="" keeps them as they are, which the csv module wants)."""
    if Path(path).suffix in COMPRESSED:
        return io.TextIOWrapper(open_bytes(path), encoding=encoding, newline=newline)
    return open(path, encoding=encoding, newline=newline)


def open_bytes(path: str | os.PathLike) -> IO[bytes]:
    """Open a file for reading bytes, decompressing .gz / .xz on the fly."""
    suffix = Path(path).suffix
    if suffix not in COMPRESSED:
        return open(path, "rb")
    check_signature(path)
    return io.BufferedReader(Decompressed(COMPRESSED[suffix](path, "rb"), path))


@contextmanager
def open_table(path: str | os.PathLike) -> Iterator:
    """A csv.reader over a CSV / TSV file (tabs for .tsv, commas otherwise), through `open_text`; newline=""
    lets the csv module read quoted fields that span lines."""
    with open_text(path, newline="") as file:
        try:
            yield csv.reader(file, delimiter=DELIMITERS.get(text_suffix(path).lower(), ","))
        except UnicodeDecodeError:  # the caller's frame holds the reader, not the file the message needs
            raise ValueError(not_utf8(path)) from None


def blank_line_blocks(path: str | os.PathLike) -> Iterator[str]:
    """The blank-line separated blocks of a text file (paragraphs, or documents), each with its line ends;
    streamed line by line, never the whole file."""
    lines = []
    with open_text(path) as file:
        for line in file:
            if line.strip():
                lines.append(line)
            elif lines:
                yield "".join(lines)
                lines = []
    if lines:
        yield "".join(lines)


TEXT_FIELD_ADVICE = "name the field that holds the text with --text-field (adapt's --text-column)"
TEXT_COLUMN_ADVICE = "name the column that holds the text with --text-field (a pretraining recipe's data.text_field)"


def table_texts(path: str | os.PathLike, column: str = "text",
                advice: str = TEXT_COLUMN_ADVICE) -> Iterator[tuple[int, str]]:
    """(line, text) for each row of a CSV / TSV table with a header: its cell under `column`, streamed, as adapt reads
    a table (a row a passage; its header, ids, dates and ratings are not text). Rows whose text is blank, and rows
    with another number of fields than the header (an unquoted delimiter), are left out, as `read_rows` leaves them.

    Raises ValueError naming the file, the columns found and `advice` for a table without `column`, and naming the
    file and line for a row the csv module cannot parse.
    """
    rows = table_rows(path)
    header = next(rows)[1] or []
    if column not in header:
        raise ValueError(f"{path} has no column {column!r} (found {header or 'no header row'}); {advice}")
    position = header.index(column)
    for line, row in rows:
        if len(row) == len(header) and row[position].strip():
            yield line, row[position]


def table_rows(path: str | os.PathLike) -> Iterator[tuple[int, list[str] | None]]:
    """A CSV / TSV table's rows, streamed, each with the line it starts on: first its header row, its names
    stripped (None for an empty file), then every data row but blank lines. The one walk of a table's rows for
    `table_texts` and the labelled-row reader (tasks/classification/reader.py).

    Raises ValueError naming the file and the line after which a row the csv module cannot parse starts.
    """
    with open_table(path) as reader:
        header = next(reader, None)
        yield 1, None if header is None else [name.strip() for name in header]
        previous_end = reader.line_num
        try:
            for row in reader:  # a quoted cell may span lines: a row starts on the line after the last row's end
                start, previous_end = previous_end + 1, reader.line_num
                if row:
                    yield start, row
        except csv.Error as error:
            raise ValueError(f"{path}: the row after line {previous_end} cannot be parsed ({error}); "
                             "fix or remove it") from None


def unescaped(text: str) -> str:
    """Text with its HTML entities as their characters (`&#039;` -> `'`, `&amp;` -> `&`): scraped text (drug reviews)
    is full of them, and read as written a vocabulary learns `039` and `it&#039;s` tokenises as `it & # 039 ; s`.
    For text that is not a page: a parsed page's text comes decoded ("&amp;lt;" on a page is the text "&lt;")."""
    return html.unescape(text)


def jsonl_objects(path: Path) -> Iterator[tuple[int, dict]]:
    """(line number, object) for each non-blank line of a JSON Lines file, streamed.

    Raises ValueError naming file:line for a line that is not JSON or not a JSON object.
    """
    with open_text(path) as file:
        for line_number, line in enumerate(file, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}:{line_number}: not valid JSON ({error.msg}); "
                                 "JSONL needs one JSON object per line") from None
            if not isinstance(record, dict):
                raise ValueError(f"{path}:{line_number}: a JSON {type(record).__name__}, not an object; "
                                 "JSONL needs one object per line, e.g. {\"text\": ...}")
            yield line_number, record




def titled(title: str, text: str) -> str:
    """What a passage with a title is encoded and indexed as: the title, a space, the text (BEIR's toolkit and
    sentence-transformers' examples join them so); the text alone without one."""
    return f"{title} {text}" if title else text


@dataclass(frozen=True)
class CorpusRecord:
    text: str
    title: str
    id: str | None  # None: the record names none, and its reader names it after its file and line


def corpus_record(record: dict, where: str, text_field: str = "text", id_field: str | None = None,
                  advice: str = TEXT_FIELD_ADVICE) -> CorpusRecord:
    """One JSON object of a corpus file, by the rule every corpus reader follows (a BEIR set, `index build` of a
    .jsonl or of a folder, adapt, pretraining, train-tokenizer, embed): the text under `text_field`, or under
    `text` when the record has no such field (one option names a folder's JSONL field and its tables' column);
    an optional str `title`; the id under `id_field`, which every record must then have, or, with none asked for,
    under `id` or else BEIR's `_id`, as a str (an int id is read as its digits).

    Raises ValueError starting with `where` (FILE:LINE) for a text or title that is not a str (ending with
    `advice`), a missing id asked for, or an id that is not a str or an int.
    """
    text, title = record.get(text_field, record.get("text")), record.get("title") or ""
    if not isinstance(text, str) or not isinstance(title, str):
        raise ValueError(f"{where}: a record needs a str {text_field!r} (and an optional str 'title'); found keys "
                         f"{sorted(record)}: {advice}")
    if id_field is None:
        passage_id = record.get("id", record.get("_id"))
    elif record.get(id_field) is None:
        raise ValueError(f"{where}: a record needs its id under {id_field!r}; found keys {sorted(record)}")
    else:
        passage_id = record[id_field]
    # bool is an int subclass; True as an id is surely a mistake.
    if passage_id is not None and (not isinstance(passage_id, (str, int)) or isinstance(passage_id, bool)):
        raise ValueError(f"{where}: the id must be a str or an int, found {type(passage_id).__name__}")
    # Ids are strings, as BEIR's, the server's and a folder's: an int id read from one file was 7 on the command
    # line and "7" from the server or from the same file in a folder.
    return CorpusRecord(text, title, None if passage_id is None else str(passage_id))


def record_texts(path: str | os.PathLike, text_field: str = "text") -> Iterator[str]:
    """The texts of a file of records, one per record, as train-tokenizer and pretraining read them, so that a
    vocabulary and the corpus it is trained for read the same text: a JSONL record's title and text (`corpus_record`,
    joined by `titled`: what index build, adapt and embed encode), a CSV / TSV row's cell under `text_field`
    (`table_texts`), its HTML entities decoded (`unescaped`) as adapt decodes a table's. A record's text is data and
    taken as written, as index build, adapt, embed and a BEIR set take it. ValueError as those readers raise."""
    if is_jsonl(path):
        for line, record in jsonl_objects(Path(path)):
            found = corpus_record(record, f"{path}:{line}", text_field)
            yield titled(found.title, found.text)
    else:
        for _, text in table_texts(path, text_field):
            yield unescaped(text)


class Decompressed(io.RawIOBase):
    """A decompressing stream whose damage (a file cut short, corrupt data) is a ValueError naming
    the file, raised wherever in the file a reader meets it, instead of the codec's bare EOFError."""

    def __init__(self, stream, path: str | os.PathLike):
        self.stream, self.path = stream, path

    @property
    def name(self) -> str:  # what io's wrappers report, and the CLI names in a UTF-8 error
        return str(self.path)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        try:
            data = self.stream.read(len(buffer))
        except (EOFError, gzip.BadGzipFile, lzma.LZMAError, zlib.error) as error:
            raise ValueError(f"{self.path} is damaged ({error}): a download or copy cut short? "
                             "fetch or compress it again") from None
        buffer[:len(data)] = data
        return len(data)

    def close(self) -> None:
        self.stream.close()
        super().close()


def check_signature(path: str | os.PathLike) -> None:
    """ValueError naming the file when a .gz / .xz file (not empty) is not in that format: the
    decompressor would only say "Not a gzipped file" somewhere in the middle of a read."""
    suffix = Path(path).suffix
    name, signature = SIGNATURES[suffix]
    with open(path, "rb") as file:
        start = file.read(len(signature))
    if start and start != signature:
        raise ValueError(f"{path} is not {name} data (its first bytes are not {name}'s): "
                         f"rename it without {suffix} if it is plain text, or compress it with {name}")


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


def not_utf8(path: str | os.PathLike) -> str:
    """The message for a file that is not UTF-8: the line of its first bad byte (`utf8_problem`), and the fix."""
    where = utf8_problem(path) or "a byte that is not UTF-8"
    return (f"{path} is not UTF-8 text ({where}); convert it, e.g. iconv -f latin1 -t utf-8 {path} > new-file, "
            "or leave it out if it is not text")


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
