"""A folder of text -> passages (each a list of sentences): what adapt trains on and indexes, and what
`bertforge index build` reads from a folder, pages or a table (`passages_file`).

Layouts, picked by each file's extension (compressed .gz / .xz read on the fly):
- plain text: a passage per blank-line block; hard-wrapped lines are joined. Consecutive short
  blocks (a line of dialogue, a heading) are joined until the passage has MIN_WORDS words, so a
  novel's passages are paragraphs of prose, not "Yes, sir."
- .jsonl: one passage per record, read by the rule every corpus reader shares (`corpus_record`): its text under
  `text_column` (or `text`), an optional `title` (kept apart: a title is not a sentence an ICT query could be cut
  from), its id under `id_column`, or with none asked for under `id` or BEIR's `_id`;
- .csv / .tsv: one passage per row, its text in `text_column`, its id in `id_column` when one is asked for;
A passage without an id is named after its file and line, row or block. An id column asked for must be there.
- HTML, Markdown, reStructuredText: plain text once the markup is gone (`markup.text_blocks`: a saved
  documentation site's pages without their navigation, scripts and permalinks).
A folder stands for the files of these kinds under it; others (a site's images, styles and scripts) are
counted and named, not read, as are its tables without the text column (a data table beside the text), its files
that are not UTF-8 text (a Latin-1 AUTHORS among a package's docs, a binary without an extension: one file named on
the command line is refused instead, with the line of its first bad byte) and a Sphinx build's `_sources` copies of
its pages' sources; hidden files and folders (.git) are left alone.
Whitespace and HTML entities are normalised, exact duplicates are dropped (after normalisation), and a passage
over `max_words` is split on sentence boundaries into passages of about that many words; with `max_tokens` (adapt's
base, the index's model for `index build`) one longer than the model's length in word pieces is split to fit it.

The passages are not held in memory: they are spooled to a temporary file as they are read (passage_store.py's
`PassageStore`) and read back by position, so a corpus larger than memory streams through (the full preset's big
corpora).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from ..atomic import replaced_file
from ..input_files import (COMPRESSED, DELIMITERS, JSONL_SUFFIX, corpus_record, jsonl_objects, not_utf8, text_suffix,
                           titled, utf8_problem)
from ..markup import HTML_SUFFIXES, MARKUP_SUFFIXES, text_blocks
from ..tasks.classification.reader import read_rows, table_columns
from ..tasks.pretraining.corpus import expand_paths, folder_files, normalise, sentences_of
from .corpus import UniqueIds, part_id
from .passage_store import Passage, PassageStore
from .token_limit import TokenLimit

TEXT_SUFFIXES = (".txt", ".text", "")
READABLE = (*TEXT_SUFFIXES, *MARKUP_SUFFIXES, JSONL_SUFFIX, *DELIMITERS)  # what a folder stands for
SPHINX_SOURCES = "_sources/ (Sphinx's copies of the pages' sources)"  # how the files sphinx_sources finds are reported
PAGE_SOURCES = ".md/.rst sources of HTML pages of the same name"  # how the files page_sources finds are reported
SOURCE_SUFFIXES = tuple(s for s in MARKUP_SUFFIXES if s not in HTML_SUFFIXES)  # Markdown and reStructuredText
DOCUMENT_SUFFIXES = (*MARKUP_SUFFIXES, *DELIMITERS)  # index build reads these as adapt does, not a line a passage
MIN_WORDS = 40  # plain text: shorter blocks are joined with the next
MAX_WORDS = 150  # ~200 word pieces: inside MiniLM's 256 tokens with room for rare words' pieces
_WORD = re.compile(r"\w+")
SAME_TEXT = 0.6  # a source whose page holds this share of its words is that page's text again (page_sources)


@dataclass
class Corpus:
    passages: PassageStore
    files: list[Path]
    words: int = 0
    duplicates: int = 0  # exact duplicate passages dropped
    split: int = 0  # passages that were over max_words and became several
    sources: dict = field(default_factory=dict)  # file -> passages read from it
    skipped: dict = field(default_factory=dict)  # suffix -> files of that kind in the folders, not read
    text_column: str = "text"  # the JSONL field or CSV/TSV column read
    tables_without_text: list = field(default_factory=list)  # CSV/TSV files in the folders without that column
    not_text: list = field(default_factory=list)  # files in the folders that are not UTF-8 text (or damaged), not read


def read_corpus(paths: Iterable[str | os.PathLike], text_column: str = "text", max_words: int = MAX_WORDS,
                id_column: str | None = None, known: set[bytes] | None = None,
                max_tokens: TokenLimit | None = None) -> Corpus:
    """Every file's passages, normalised, deduplicated and split to at most ~max_words words. known: the
    `text_digest`s of passages held already (an index added to): those are duplicates too. max_tokens: a
    model's limit (`TokenLimit`): a passage whose parts would still be longer is split to fit it instead.

    Raises ValueError (one line naming the file and the fix) for a binary or non-UTF-8 file named in `paths`,
    a table without `text_column`, a malformed JSONL line, or an id that two records share. A folder's files that
    are not text are left out (`Corpus.not_text`): one Latin-1 file among thousands refused the whole folder.
    """
    paths = list(paths)
    files = expand_paths(paths, suffixes=READABLE, recursive=True)  # a folder: its text files, however deep
    sources = {SPHINX_SOURCES: sphinx_sources(files, paths), PAGE_SOURCES: page_sources(files, paths)}
    left_out = set().union(*sources.values())
    files = [path for path in files if path not in left_out]
    seen, ids = set(known or ()), UniqueIds()  # ids: the index is keyed by them, and a clash is better said now
    skipped = {**{why: len(found) for why, found in sources.items() if found},
               **unread_kinds(paths, files + sorted(left_out))}
    corpus = Corpus(PassageStore(), files, skipped=skipped, text_column=text_column)
    named = {Path(path) for path in paths if not Path(path).is_dir()}
    for path, name in source_names(files).items():
        if (problem := text_problem(path)) is not None:
            if path in named:
                raise ValueError(problem)
            corpus.not_text.append(str(path))
            continue
        if path not in named and text_suffix(path).lower() in DELIMITERS and text_column not in table_columns(path):
            corpus.tables_without_text.append(str(path))  # a data table beside the text, not a corpus of rows
            continue
        count, continues = 0, one_document(path)
        for passage in file_passages(path, name, text_column, id_column):
            key = passage_digest(passage)
            if key in seen:
                corpus.duplicates += 1
                continue
            seen.add(key)
            pieces = split_long(passage, max_words)
            if max_tokens is not None and not all(map(max_tokens.fits, pieces)):
                pieces = max_tokens.split(passage)
            if known and len(pieces) > 1:  # an index holds a long passage's parts, not the passage
                new = [piece for piece in pieces if passage_digest(piece) not in known]
                corpus.duplicates += not new
                pieces = new
            corpus.split += len(pieces) > 1
            for number, piece in enumerate(pieces):
                ids.check([piece], str(path))
                ids.remember([piece])
                # a file's first passage starts a document; a record's parts continue it
                corpus.passages.append(piece, follows=count + number > 0 and (continues or number > 0))
                corpus.words += piece.words
            count += len(pieces)
        corpus.sources[str(path)] = count
    return corpus


def source_names(files: list[Path]) -> dict[Path, str]:
    """{file: the name its passages' ids start with}: the file's name, or, where two files share a name (a site's
    every folder has an index.html), its path from the folder the files have in common."""
    names = Counter(path.name for path in files)
    common = Path(os.path.commonpath([path.resolve().parent for path in files]))
    return {path: path.name if names[path.name] == 1 else path.resolve().relative_to(common).as_posix()
            for path in files}


def sphinx_sources(files: list[Path], paths: list) -> set[Path]:
    """The files in a Sphinx build's `_sources` folder (a folder beside .html pages) inside a folder given: its
    copies of the sources the pages were built from, the same text again in another form; the pages are read
    instead. A `_sources` folder given itself is read."""
    given = {Path(path) for path in paths}
    builds: dict[Path, bool] = {}
    found = set()
    for path in files:
        for folder in path.parents:
            if folder in given:
                break
            if folder.name == "_sources":
                if folder.parent not in builds:
                    builds[folder.parent] = any(folder.parent.glob("*.html"))
                if builds[folder.parent]:
                    found.add(path)
                break
    return found


def page_sources(files: list[Path], paths: list) -> set[Path]:
    """The Markdown and reStructuredText files inside a folder given that an HTML page among the files was built
    from: a site's sources beside its pages (npm's docs/content/*.md and docs/output/*.html), the same text again,
    which would put every passage in the index twice and let a held-out query's sentence be found in its twin. A
    source is paired with a page of its name (less the suffix) that holds most of its words, so an index.md and an
    index.html of different text are both read. The pages are read; a file named on the command line is read."""
    named = {Path(path) for path in paths}
    pages: dict[str, list[Path]] = {}
    for path in files:
        if text_suffix(path).lower() in HTML_SUFFIXES:
            pages.setdefault(path.stem, []).append(path)
    words = CachedWords()
    return {path for path in files
            if path not in named and text_suffix(path).lower() in SOURCE_SUFFIXES and path.stem in pages
            and any(words.share_in(path, page) >= SAME_TEXT for page in pages[path.stem])}


class CachedWords:
    """Each file's distinct lower-cased words, its markup gone, read once (a page may be checked against several
    sources)."""

    def __init__(self):
        self._words: dict[Path, frozenset] = {}

    def of(self, path: Path) -> frozenset:
        if path not in self._words:  # a binary or non-UTF-8 file has no words here; text_problem says so later
            self._words[path] = frozenset() if utf8_problem(path) is not None else frozenset(
                word for block in text_blocks(path) for word in _WORD.findall(block.lower()))
        return self._words[path]

    def share_in(self, source: Path, page: Path) -> float:
        """The share of `source`'s distinct words that `page` holds (0 for a source without words)."""
        source_words = self.of(source)
        return len(source_words & self.of(page)) / len(source_words) if source_words else 0.0


def unread_kinds(paths: list, read: list[Path]) -> dict[str, int]:
    """{suffix: count} of the files in the given folders that are not of a kind adapt reads, most first."""
    read = set(read)
    kinds = Counter(kind_of(path) for folder in map(Path, paths) if folder.is_dir()
                    for path in folder_files(folder, recursive=True) if path not in read)
    return dict(kinds.most_common())


def kind_of(path: Path) -> str:
    """How a file left out is counted: its suffix with what a compressed one holds (.pdf.gz: a bare .gz said that
    compressed files are not read, where a .txt.gz is), or its name when it has no suffix."""
    suffix = path.suffix.lower()
    if suffix in COMPRESSED:
        suffix = text_suffix(path).lower() + suffix
    return suffix or path.name


def passage_digest(passage: Passage) -> bytes:
    """16 bytes that tell exact duplicates apart: the set of those seen holds these, not a second copy of the text.
    Of what is indexed and encoded (`passage_text`), so a passage can be matched against an index's texts."""
    return text_digest(passage_text(passage))


def text_digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode(), digest_size=16).digest()


def one_document(path: Path) -> bool:
    """Whether a file's passages are one document, each following the one before it (a plain-text or markup file:
    tasks/retrieval/neighbours.py), rather than records each a document of its own (.jsonl, a table)."""
    suffix = text_suffix(path).lower()
    return suffix != JSONL_SUFFIX and suffix not in DELIMITERS


def text_problem(path: Path) -> str | None:
    """Why `path` cannot be read as text, in one line (not UTF-8: where and the fix; a damaged or mislabelled .gz /
    .xz), or None."""
    try:
        return None if utf8_problem(path) is None else not_utf8(path)
    except ValueError as error:  # input_files' one-line reasons for a compressed file that is not
        return str(error)


def file_passages(path: Path, name: str, text_column: str, id_column: str | None = None) -> Iterator[Passage]:
    """The passages of one file, their ids made from `name` (source_names) unless its records give ids: a JSONL
    record's `id_column` (or with none asked for its `id`, or BEIR's `_id`); a table's only when `id_column` is
    asked for (a folder's tables may each number their rows from 1). A file without the id column asked for is
    refused (ValueError): a misspelt name would otherwise leave every passage named after its line."""
    suffix = text_suffix(path).lower()
    if suffix == JSONL_SUFFIX:
        yield from jsonl_passages(path, name, text_column, id_column)
    elif suffix in DELIMITERS:
        if id_column is not None and id_column not in (found := table_columns(path)):
            raise ValueError(f"{path} has no column {id_column!r} for the passages' ids (found {found}); name the "
                             "column that holds them, or none to name rows FILE:ROW")
        rows = read_rows(path, text_columns=[text_column], id_column=id_column)
        ids = rows.ids if id_column is not None else [f"{name}:{row}" for row in rows.row_numbers]
        for texts, passage_id in zip(rows.texts, ids):
            sentences = sentences_of(texts[0])
            if sentences:
                yield Passage(str(passage_id), sentences)
    else:
        yield from text_passages(path, name)


def jsonl_passages(path: Path, name: str, text_field: str = "text", id_field: str | None = None) -> Iterator[Passage]:
    for line_number, record in jsonl_objects(path):
        found = corpus_record(record, f"{path}:{line_number}", text_field, id_field)
        # A record's text is data, not HTML: taken as written, as a streamed .jsonl and a BEIR set read it
        # (`&amp;` decoded here only gave the folder's passage another text than the same file streamed)
        sentences = sentences_of(found.text, escaped=False)
        if sentences:
            yield Passage(f"{name}:{line_number}" if found.id is None else found.id, sentences,
                          normalise(found.title, escaped=False))


def text_passages(path: Path, name: str) -> Iterator[Passage]:
    """Blank-line blocks (of the text, markup gone), short ones joined with the next until MIN_WORDS words."""
    pending: list[str] = []
    start = 0
    escaped = text_suffix(path).lower() not in MARKUP_SUFFIXES  # a page's entities are decoded once, by its parser
    for number, block in enumerate(text_blocks(path)):
        if not pending:
            start = number
        pending.extend(sentences_of(block, escaped))
        if sum(len(s.split()) for s in pending) >= MIN_WORDS:
            yield Passage(f"{name}:{start}", pending)
            pending = []
    if pending:
        yield Passage(f"{name}:{start}", pending)


def passage_text(passage: Passage) -> str:
    """What is indexed and encoded: the title (when there is one) before the sentences, as every corpus reader
    joins them (`titled`)."""
    return titled(passage.title, passage.text)


def split_long(passage: Passage, max_words: int) -> list[Passage]:
    """A passage over max_words -> consecutive runs of whole sentences of about max_words (>= 1 sentence each)."""
    if passage.words <= max_words:
        return [passage]
    total = passage.words
    parts = -(-total // max_words)
    target = total / parts  # even parts: no 5-word tail passage
    pieces: list[list[str]] = [[] for _ in range(parts)]
    position = 0
    for sentence in passage.sentences:  # a sentence goes to the part its middle word falls in
        words = len(sentence.split())
        pieces[min(parts - 1, int((position + words / 2) / target))].append(sentence)
        position += words
    pieces = [piece for piece in pieces if piece]
    return [Passage(part_id(passage.id, i), sentences, passage.title) for i, sentences in enumerate(pieces)]


def corpus_summary(corpus: Corpus, command: str = "adapt", text_option: str = "--text-column") -> list[str]:
    """What was read and what was left out, a line each (adapt and `index build` print them)."""
    read = len(corpus.files) - len(corpus.tables_without_text) - len(corpus.not_text)  # said below, not read
    lines = [f"corpus: {read} file(s), {len(corpus.passages):,} passages, {corpus.words:,} words "
             f"({corpus.duplicates} exact duplicates dropped, {corpus.split} long passages split on sentences)"]
    if corpus.tables_without_text:
        tables = corpus.tables_without_text
        lines.append(f"left out {len(tables)} table(s) in the folders without a {corpus.text_column!r} column "
                     f"({tables[0]}{', ...' if len(tables) > 1 else ''}); {text_option} names the column that holds "
                     "the text")
    if corpus.not_text:
        lines.append(not_text_line(corpus.not_text))
    if corpus.skipped:
        kinds = ", ".join(f"{kind} {count:,}" for kind, count in list(corpus.skipped.items())[:6])
        readable = ", ".join(filter(None, READABLE))
        lines.append(f"left out {sum(corpus.skipped.values()):,} files in the folders ({kinds}"
                     f"{', ...' if len(corpus.skipped) > 6 else ''}); in a folder {command} reads {readable} "
                     "files; name a file on the command line to read it as plain text whatever its kind")
    return lines


def not_text_line(files: list[str]) -> str:
    """The line for a folder's files left out as not UTF-8 text: how many, the first, and the fix."""
    return (f"left out {len(files):,} file(s) in the folders that are not UTF-8 text ({files[0]}"
            f"{', ...' if len(files) > 1 else ''}); convert one that is text, e.g. iconv -f latin1 -t utf-8 FILE > "
            "FILE.txt, or name it on the command line to see its first bad byte")


def no_text_found(where: str, text_option: str = "--text-column", not_text: list[str] | None = None) -> str:
    """The one line for a corpus that holds no passage: what is read, and how (and the files that were not text)."""
    found = f" ({not_text_line(not_text)})" if not_text else ""
    return (f"no text found in {where}{found}; give text files (passages separated by blank lines), HTML, Markdown or "
            f"reStructuredText pages, .jsonl with a 'text' field, or .csv/.tsv with {text_option}")


def reads_as_documents(path: Path) -> bool:
    """A folder, HTML / Markdown / reStructuredText pages or a CSV / TSV table: `index build` reads them as adapt
    does (read_corpus). A plain text file and .jsonl it streams a line a passage (search/corpus.py)."""
    return path.is_dir() or text_suffix(path).lower() in DOCUMENT_SUFFIXES


def write_passages_file(passages: PassageStore, path: Path) -> None:
    """`passages` as the JSONL an index reads: {"id", "text"} a line, the text as it is encoded (`passage_text`), and
    "follows": true on a passage that continues the previous one's document (PassageStore.follows)."""
    follows = passages.follows
    with replaced_file(path) as temporary, temporary.open("w", encoding="utf-8") as lines:  # a line at a time
        for passage, continues in zip(passages, follows):
            record = {"id": passage.id, "text": passage_text(passage), **({"follows": True} if continues else {})}
            lines.write(json.dumps(record, ensure_ascii=False) + "\n")
