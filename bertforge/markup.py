"""Plain text from the formats documentation is kept in: HTML pages, Markdown and reStructuredText.

A technical corpus is rarely plain text: a saved documentation site is HTML, a repository's docs
are Markdown or reStructuredText. Read as plain text, their markup becomes the corpus: a Sphinx
page's navigation bar and sidebar repeat on every page, `<a class="headerlink">` pilcrows and
`:func:` roles land in passages, and the model trains and indexes on tag soup. `text_blocks` gives
every corpus reader the same thing for each format: the file's text as blank-line blocks
(paragraphs, headings, list items, code), which is what the plain-text readers take.

- HTML (.html, .htm, .xhtml): the page's main content (`<main>` or `role="main"` when the page
  marks it, else the body) without scripts, styles, navigation, headers and footers outside the
  content, forms, permalink anchors, and banners, breadcrumbs and tables of contents marked by an
  id or class; every block element (p, li, h1-h6, pre, td, ...) a block; entities decoded (Python's
  html.parser, which tolerates unclosed tags).
- Markdown (.md, .markdown): front matter, fence lines, heading and list markers, link and image
  syntax (their text kept), emphasis markers, inline HTML tags and table rules dropped, backslash escapes
  resolved; code kept.
- reStructuredText (.rst): heading underlines, directive and comment lines (`.. note::`, `.. _label:`)
  and their option lines dropped; roles, links and literals reduced to their text (`:func:`len`` ->
  len); a directive's indented body (code, a note's text) kept.
Anything else is read by blank-line blocks as it is.
"""
from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from html.parser import HTMLParser

from .input_files import blank_line_blocks, open_text, text_suffix

# ------------------------------------------------------------------------------------------------ HTML

# Elements whose text is never content. <header> and <footer> are skipped only outside <main> / <article>,
# where they are the page's banner and footer rather than an article's own title line.
SKIPPED = {"script", "style", "noscript", "template", "svg", "math", "head", "title", "nav", "aside", "form",
           "button", "select", "iframe", "object", "canvas"}
PAGE_FURNITURE = {"header", "footer"}
SKIPPED_ROLES = {"navigation", "banner", "contentinfo", "search", "complementary"}
SKIPPED_CLASSES = {"headerlink"}  # Sphinx's and MkDocs' pilcrow permalinks after every heading
# Page furniture that many generators mark only by an id or class, not a tag or role: a banner, breadcrumbs, the
# page's table of contents (npm's docs: <section id="table_of_contents">, a list of the headings that follow).
SKIPPED_NAMES = {"banner", "breadcrumb", "breadcrumbs", "sidebar", "toc", "table-of-contents", "table_of_contents"}
CONTENT = {"main", "article"}
BLOCKS = {"address", "article", "blockquote", "body", "br", "caption", "dd", "details", "div", "dl", "dt",
          "figcaption", "figure", "h1", "h2", "h3", "h4", "h5", "h6", "hr", "li", "main", "ol", "p", "pre",
          "section", "summary", "table", "td", "th", "tr", "ul"}
VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "param", "source", "track",
        "wbr"}


@dataclass
class _Element:
    tag: str
    skipped: bool
    main: bool  # the page's marked main content: <main> or role="main"
    content: bool  # inside <main> or <article>, where <header> and <footer> belong to the text


class _PageText(HTMLParser):
    """Collects a page's text blocks, remembering which lie inside its marked main content."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.open: list[_Element] = []
        self.blocks: list[tuple[str, bool]] = []  # (text, whether it lies in the marked main content)
        self.pieces: list[str] = []  # the text of the block being read
        self.in_main = False  # whether any of it lies in the main content

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in BLOCKS:
            self.end_block()
        if tag in VOID:
            return
        if tag == "body":
            self.handle_endtag("head")  # a <head> left open (HTML lets </head> go unwritten) ends at <body>
        attributes = dict(attrs)
        role, classes = attributes.get("role"), set((attributes.get("class") or "").split())
        names = {name.lower().strip("_") for name in (*classes, attributes.get("id") or "")}
        parent = self.open[-1] if self.open else _Element("", False, False, False)
        main = parent.main or tag == "main" or role == "main"
        skipped = (parent.skipped or tag in SKIPPED or role in SKIPPED_ROLES or bool(SKIPPED_CLASSES & classes)
                   or bool(SKIPPED_NAMES & names)
                   or (tag in PAGE_FURNITURE and not parent.content))
        self.open.append(_Element(tag, skipped, main, content=main or parent.content or tag in CONTENT))

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in BLOCKS:
            self.end_block()  # <br/>, <hr/>; a self-closed element holds no text

    def handle_endtag(self, tag: str) -> None:
        if tag in BLOCKS:
            self.end_block()
        # Close the element and any left unclosed inside it (<p> and <li> often are); a stray end tag is ignored.
        for depth in range(len(self.open) - 1, -1, -1):
            if self.open[depth].tag == tag:
                del self.open[depth:]
                return

    def handle_data(self, data: str) -> None:
        element = self.open[-1] if self.open else None
        if element is not None and element.skipped:
            return
        if data.strip():
            self.in_main = self.in_main or (element is not None and element.main)
        self.pieces.append(data)

    def end_block(self) -> None:
        text = " ".join("".join(self.pieces).split())
        if text:
            self.blocks.append((text, self.in_main))
        self.pieces, self.in_main = [], False

    def page_blocks(self) -> list[str]:
        self.end_block()
        main = [text for text, in_main in self.blocks if in_main]
        return main or [text for text, _ in self.blocks]


# `<![` opens a marked section (<![CDATA[ ... ]]>, IE's <![if ...]>); before any other word html.parser raises an
# AssertionError ("expected name token") instead of reading on, so such a `<![` is read as the text it is.
_NOT_A_MARKED_SECTION = re.compile(r"<!\[(?!(?:cdata|temp|ignore|include|rcdata|if|else|endif)(?![-.\w]))",
                                   re.IGNORECASE)


def html_blocks(page: str) -> list[str]:
    """The text blocks of an HTML page's content (see the module's docstring), in order."""
    parser = _PageText()
    parser.feed(_NOT_A_MARKED_SECTION.sub("&lt;![", page))
    parser.close()
    return parser.page_blocks()


# -------------------------------------------------------------------------------------------- Markdown

_FENCE = re.compile(r"^\s*(```|~~~)")
_HEADING = re.compile(r"^\s{0,3}#{1,6}\s+(.*?)\s*#*\s*$")
_SETEXT = re.compile(r"^\s{0,3}(=+|-+)\s*$")
_LIST_MARKER = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s+")
_QUOTE = re.compile(r"^\s*(?:>\s?)+")
_BREAK = re.compile(r"^\s{0,3}([-*_])(\s*\1){2,}\s*$")  # a thematic break: --- or *** or ___
_TABLE_RULE = re.compile(r"^\s*\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?\s*$")
_LINK_DEFINITION = re.compile(r"^\s{0,3}\[[^\]]+\]:\s+\S+")
_IMAGE = re.compile(r"!\[([^\]]*)\]\([^)]*\)")
_LINK = re.compile(r"\[([^\]]+)\](?:\([^)]*\)|\[[^\]]*\])")
_AUTOLINK = re.compile(r"<((?:https?|mailto):[^>\s]+)>")
_TAG = re.compile(r"</?[A-Za-z][^>]*>|<!--.*?-->")
_EMPHASIS = re.compile(r"(\*\*|__)(?=\S)(.+?)(?<=\S)\1")
# *word* and _word_: not inside a word (snake_case_names and 2*3*4 keep theirs), nor with a space inside the marker
_SINGLE_EMPHASIS = re.compile(r"(?<![\w*])\*(?=[^\s*])([^*]+?)(?<=\S)\*(?![\w*])"
                              r"|(?<![\w_])_(?=[^\s_])([^_]+?)(?<=\S)_(?![\w_])")
_CODE_SPAN = re.compile(r"(`+[^`]+`+)")
# \[ \* \_ ...: the character itself (CommonMark's escapable ASCII), kept out of the other rules' way meanwhile as a
# private-use character (U+E000 + its code)
_ESCAPE = re.compile(r"\\([!-/:-@\[-`{-~])")
_HIDDEN = re.compile("[\ue000-\ue07f]")
# A link whose text holds code ([`require()`][require], Node's docs' every API link): matched before the code spans
# are set apart, a code span scanned as a whole first so that no link is looked for inside one.
_CODE_LINK = re.compile(r"(`+[^`]+`+)|\[((?:[^\]`]*`+[^`]+`+)+[^\]`]*)\](?:\([^)]*\)|\[[^\]]*\])")


def markdown_inline(text: str) -> str:
    """Inline Markdown -> its words: images' alt text, links' text, code without backticks, no emphasis markers
    (** __ * _). Code spans are left as written (`__init__` keeps its underscores; emphasis is not looked for inside
    code)."""
    text = _CODE_LINK.sub(lambda match: match.group(1) or match.group(2), text)
    pieces = _CODE_SPAN.split(text)  # odd positions: the code spans, backticks included
    for position in range(0, len(pieces), 2):
        piece = _ESCAPE.sub(lambda match: chr(0xE000 + ord(match.group(1))), pieces[position])
        piece = _IMAGE.sub(r"\1", piece)
        piece = _LINK.sub(r"\1", piece)
        piece = _AUTOLINK.sub(r"\1", piece)
        piece = _TAG.sub("", piece)
        piece = _EMPHASIS.sub(r"\2", piece)
        piece = _SINGLE_EMPHASIS.sub(lambda match: match.group(1) or match.group(2), piece)
        pieces[position] = _HIDDEN.sub(lambda match: chr(ord(match.group()) - 0xE000), piece)
    for position in range(1, len(pieces), 2):
        pieces[position] = pieces[position].strip("`")
    return "".join(pieces)


def markdown_blocks(source: str) -> Iterator[str]:
    """A Markdown document's blocks: paragraphs, headings (each its own block), list items' text, code."""
    lines = source.splitlines()
    if lines and lines[0].strip() == "---" and "---" in (line.strip() for line in lines[1:]):
        lines = lines[[line.strip() for line in lines[1:]].index("---") + 2:]  # YAML front matter
    block: list[str] = []
    in_code = False
    for line in lines:
        if _FENCE.match(line):
            in_code = not in_code
            yield from _flush(block)
            continue
        if in_code:
            block.append(line)
            continue
        heading = _HEADING.match(line)
        if heading or (_SETEXT.match(line) and block):
            text = heading.group(1) if heading else block.pop()  # a setext heading's text is the line above it
            yield from _flush(block)
            yield from _flush([markdown_inline(text)])
        elif _TABLE_RULE.match(line) and not _BREAK.match(line):
            continue  # the |---|---| under a table's header row
        elif not line.strip() or _BREAK.match(line) or _LINK_DEFINITION.match(line):
            yield from _flush(block)
        else:
            text = _QUOTE.sub("", _LIST_MARKER.sub("", line))
            if _LIST_MARKER.match(line):
                yield from _flush(block)  # each list item its own block
            block.append(markdown_inline(text.replace("|", " ") if line.lstrip().startswith("|") else text))
    yield from _flush(block)


def _flush(lines: list[str]) -> Iterator[str]:
    text = "\n".join(" ".join(line.split()) for line in lines if line.strip())
    lines.clear()
    if text.strip():
        yield text


# ----------------------------------------------------------------------------------- reStructuredText

_UNDERLINE = re.compile(r"^([=\-~^*+#\"'`])\1{2,}\s*$")
_ROLE = re.compile(r":[\w:-]+:`([^`]*)`")
_RST_LINK = re.compile(r"`([^`<]*?)\s*<[^>]*>`_{1,2}")
_REFERENCE = re.compile(r"`([^`]+)`_{1,2}")
_LITERAL = re.compile(r"``([^`]+)``")


def rst_inline(text: str) -> str:
    """Inline reStructuredText -> its words: roles, links and literals become their text."""
    text = _ROLE.sub(lambda match: re.sub(r"\s*<[^>]*>$", "", match.group(1)).lstrip("~!"), text)
    text = _RST_LINK.sub(r"\1", text)
    text = _LITERAL.sub(r"\1", text)
    return _REFERENCE.sub(r"\1", text)


@dataclass
class Section:
    heading: str
    paragraphs: list[str]


def rst_sections(source: str) -> list[Section]:
    """A reStructuredText document -> its sections in order: each heading and the paragraphs under it, each
    paragraph one line of plain text (directive and comment lines dropped, their indented bodies kept)."""
    lines = source.splitlines()
    found = [Section("", [])]
    paragraph: list[str] = []
    in_directive = False

    def close_paragraph():
        if paragraph:
            found[-1].paragraphs.append(rst_inline(" ".join(line.strip() for line in paragraph)))
            paragraph.clear()

    for number, line in enumerate(lines):
        following = lines[number + 1] if number + 1 < len(lines) else ""
        if _UNDERLINE.match(line):  # an underline (or overline) of a heading
            continue
        if line.strip() and not line.startswith(" ") and _UNDERLINE.match(following) \
                and len(following.strip()) >= len(line.strip()) - 1:
            close_paragraph()
            found.append(Section(rst_inline(line.strip()), []))
            continue
        if line.strip().startswith(".. "):  # a directive or a label; its indented options follow it
            close_paragraph()
            in_directive = True
            continue
        if not line.strip():
            close_paragraph()
            in_directive = False
            continue
        if in_directive and line.lstrip().startswith(":"):  # a directive's :option: lines
            continue
        in_directive = False
        paragraph.append(line)
    close_paragraph()
    return [section for section in found if section.heading or section.paragraphs]


def rst_blocks(source: str) -> Iterator[str]:
    for section in rst_sections(source):
        yield from (text for text in (section.heading, *section.paragraphs) if text)


# ------------------------------------------------------------------------------------------- any file

HTML_SUFFIXES = (".html", ".htm", ".xhtml")
READERS: dict[str, Callable[[str], Iterator[str] | list[str]]] = {
    **dict.fromkeys(HTML_SUFFIXES, html_blocks),
    ".md": markdown_blocks, ".markdown": markdown_blocks,
    ".rst": rst_blocks,
}
MARKUP_SUFFIXES = tuple(READERS)


def text_blocks(path: str | os.PathLike) -> Iterator[str]:
    """A text file's blank-line blocks, its markup (by the suffix, see the module's docstring) reduced to text.
    Plain text streams; a marked-up file is read whole (a page or a document, not a corpus)."""
    reader = READERS.get(text_suffix(path).lower())
    if reader is None:
        yield from blank_line_blocks(path)
        return
    with open_text(path) as file:
        yield from reader(file.read())
