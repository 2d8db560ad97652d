"""Read raw text into documents (lists of sentences), streaming, one document at a time.

Five layouts, picked by file extension and `document_boundary`:
- plain text (any extension but .jsonl, .csv, .tsv), `document_boundary="blank_line"`: every block of
  lines between blank lines is a document; the original BERT input format (one sentence per
  line) is this layout with `split_sentences=split_lines`.
- plain text, `document_boundary="file"`: the whole file is one document (a novel, say); its
  blank-line blocks are paragraphs, each split into sentences on its own.
- plain text, `document_boundary="chapter"`: a book; a paragraph that is only a heading line
  ("CHAPTER IV", "Chapter 12", "VOLUME II", "BOOK 3", "PART ONE") ends one document and starts
  the next, and the heading itself is dropped. Chapters are what NSP wants from a novel: long
  runs of true continuations, and enough documents to draw random next segments from.
- JSON Lines (.jsonl, in any case): one document per line, its title and text (`input_files.record_texts`: the
  title before the text, as every corpus reader joins them, and as train-tokenizer reads it); blank lines in
  the text separate paragraphs.
- CSV / TSV tables (.csv, .tsv): one document per row, its cell under `text_field` (a table without that column
  is refused, naming the columns found): the header, ids, dates and ratings are not prose.
HTML entities (`&#039;` in scraped reviews) are decoded in plain text and tables (`input_files.unescaped`, as adapt
reads them); a JSONL record's text is taken as written, and a page's parser decodes its own once. Hard-wrapped
lines are joined with spaces before sentence splitting. HTML, Markdown and reStructuredText files are plain text
once their markup is gone (`markup.text_blocks`: a page's content, not its navigation); they are read when named,
as tables are, since a folder stands for its .txt and .jsonl files (a corpus folder's README.md is about the data,
not data). Any of these may be
compressed (`.txt.gz`, `.jsonl.xz`): it is read as text on the fly.
"""
import os
import re
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Literal, get_args

from ...input_files import JSONL_SUFFIX, is_jsonl, is_table, record_texts, require_file, text_suffix, unescaped
from ...markup import MARKUP_SUFFIXES, text_blocks

DocumentBoundary = Literal["blank_line", "file", "chapter"]
DOCUMENT_BOUNDARIES = get_args(DocumentBoundary)
JSONL_SUFFIXES = (JSONL_SUFFIX,)
_WHITESPACE = re.compile(r"\s+")
# A chapter's number: roman or arabic numerals, or a number word ("Chapter Twenty-One", "Book the First"). Any word
# there took "Part company." and "Book now." for headings: dropped, and a new document started at them.
_UNITS = "one|two|three|four|five|six|seven|eight|nine"
_ORDINAL_UNITS = "first|second|third|fourth|fifth|sixth|seventh|eighth|ninth"
_NUMBER_WORD = (rf"(?:(?:twenty|thirty|forty|fifty|sixty|seventy|eighty|ninety)(?:[- ](?:{_UNITS}|{_ORDINAL_UNITS}))?"
                r"|twentieth|thirtieth|fortieth|fiftieth|ten|eleven|twelve|(?:thir|four|fif|six|seven|eigh|nine)teen"
                rf"|tenth|eleventh|twelfth|(?:thir|four|fif|six|seven|eigh|nine)teenth|{_UNITS}|{_ORDINAL_UNITS}"
                r"|last|final)")
_HEADING = re.compile(rf"(chapter|volume|book|part)\s+(?:the\s+)?([ivxlcdm]+|\d+|{_NUMBER_WORD})\.?", re.IGNORECASE)

# How files are read into documents, recorded with the caches made from them (prepared corpora, trained
# vocabularies) so one read another way is made again: 2 since 2026-11-27 (a record's title, a table's text
# column, HTML entities decoded in text files and tables), 3 since 2026-11-28 (chapter headings are numbered:
# "Part company." is text); a cache recording none was read by rule 1.
TEXT_RULE = 3


def split_sentences(text: str) -> list[str]:
    """Split one paragraph into sentences with the Punkt model of `nupunkt`.

    Punkt learned abbreviations ("Mr.", "Mrs.", "St.") from data, so "Mr. Darcy" stays whole,
    and it splits inside quoted speech ("Oh! Single, my dear!"), which NSP needs: a whole
    speech as one "sentence" would often fill a sequence on its own and force a random next.
    """
    try:
        import nupunkt  # imported here so reading pre-split corpora does not need it
    except ImportError:
        raise ValueError("sentence splitting needs the nupunkt package (Python >= 3.11): pip install nupunkt; "
                         "or give one sentence per line and use split_sentences=split_lines") from None

    text = _WHITESPACE.sub(" ", text).strip()
    if not text:
        return []
    return [sentence.strip() for sentence in nupunkt.sent_tokenize(text) if sentence.strip()]


def sentences_of(text: str, escaped: bool = True) -> list[str]:
    """Sentences of one text; blank lines inside it end a sentence (a heading has no full stop)."""
    return [normalise(s, escaped) for paragraph in re.split(r"\n\s*\n", text) for s in split_sentences(paragraph)
            if normalise(s, escaped)]


def normalise(text: str, escaped: bool = True) -> str:
    """Whitespace runs as one space; with `escaped`, HTML entities (&#039; in scraped reviews) as their characters
    (a marked-up page's text comes decoded: "&amp;lt;" on a page is the text "&lt;", not "<")."""
    return _WHITESPACE.sub(" ", unescaped(text) if escaped else text).strip()


def split_lines(text: str) -> list[str]:
    """One sentence per line: the input format of google-research/bert's create_pretraining_data."""
    return [line.strip() for line in text.splitlines() if line.strip()]


def expand_paths(paths: str | os.PathLike | Iterable[str | os.PathLike],
                 suffixes: tuple[str, ...] | None = (".txt", *JSONL_SUFFIXES), recursive: bool = False) -> list[Path]:
    """Files to read, in order: a folder stands for its files with these suffixes (None: any file), sorted by
    name, its subfolders' too when recursive; never a hidden file or one in a hidden folder (.git's objects).

    Raises ValueError for a path that does not exist, a folder without such files, or no paths.
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    files = []
    for path in map(Path, paths):
        if path.is_dir():
            found = sorted(p for p in folder_files(path, recursive)
                           if suffixes is None or text_suffix(p).lower() in suffixes)
            if not found:
                kinds = "no " + ", ".join(filter(None, suffixes)) + " files" if suffixes else "no files"
                raise ValueError(f"folder {path} has {kinds}; pass the files themselves")
            files.extend(found)
        else:
            files.append(require_file(path, "corpus file"))
    if not files:
        raise ValueError("no corpus files given; pass a file, a folder or a list of them")
    return files


def folder_files(folder: Path, recursive: bool) -> Iterator[Path]:
    """The files in a folder (and its subfolders when recursive) that are not hidden or in a hidden folder."""
    for path in folder.rglob("*") if recursive else folder.iterdir():
        if path.is_file() and not any(part.startswith(".") for part in path.relative_to(folder).parts):
            yield path


def read_documents(paths: str | os.PathLike | Iterable[str | os.PathLike], document_boundary: str = "blank_line",
                   text_field: str = "text",
                   split_sentences: Callable[[str], list[str]] = split_sentences) -> Iterator[list[str]]:
    """Yield documents, each a list of sentence strings, file after file; empty documents are skipped.

    `split_sentences` turns one paragraph (text without blank lines, possibly hard-wrapped) into
    sentences. Raises ValueError for a missing file, an unknown `document_boundary`, a JSONL
    line that is not a JSON object with a str under `text_field` (the message names file:line), and a table
    without a `text_field` column (the message names the columns found).
    """
    if document_boundary not in DOCUMENT_BOUNDARIES:
        raise ValueError(f"unknown document_boundary {document_boundary!r}; use one of {DOCUMENT_BOUNDARIES}")
    for path in expand_paths(paths):
        if is_jsonl(path) or is_table(path):  # a record or a row is a document, whatever the boundary
            documents = (_sentences(text, split_sentences) for text in record_texts(path, text_field))
        elif document_boundary == "file":
            documents = _file_document(path, split_sentences)
        elif document_boundary == "chapter":
            documents = _chapter_documents(path, split_sentences)
        else:
            documents = (_sentences(block, split_sentences) for block in _blocks(path))
        yield from (document for document in documents if document)


def _file_document(path: Path, split: Callable[[str], list[str]]) -> Iterator[list[str]]:
    # Paragraphs are split one at a time so that no sentence runs across a paragraph
    # (a heading like "Chapter 1" has no full stop to end it).
    yield [sentence for block in _blocks(path) for sentence in split(block)]


def _chapter_documents(path: Path, split: Callable[[str], list[str]]) -> Iterator[list[str]]:
    document = []
    for block in _blocks(path):
        if _HEADING.fullmatch(block.strip()):
            yield document
            document = []
        else:
            document.extend(split(block))
    yield document


def _blocks(path: Path) -> Iterator[str]:
    """A text file's blank-line blocks as its text: a page's without its markup (its parser decoded its entities),
    plain text's with its HTML entities decoded, as train-tokenizer reads them (`vocab_training.text_chunks`)."""
    if text_suffix(path).lower() in MARKUP_SUFFIXES:
        return text_blocks(path)
    return map(unescaped, text_blocks(path))


def _sentences(text: str, split: Callable[[str], list[str]]) -> list[str]:
    """Sentences of a text whose paragraphs are separated by blank lines."""
    return [sentence for paragraph in re.split(r"\n\s*\n", text) for sentence in split(paragraph)]
