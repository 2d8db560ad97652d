"""scripts/debian_faq_set.py: DocBook HTML to questions, answers and passages (the Debian downloads are not run)."""
from __future__ import annotations

import pytest

from faq_set_scripts import BAD_INPUT, check_bad_input_is_one_line, loaded_script

# The shape of the debian-faq package's pages: a chapter title and a table of contents that lists the questions,
# then each question an <h2> (numbered, a no-break space after the number) with its answer and <h3> subsections.
FAQ_PAGE = """<html><head><title>Chapter 8. Package tools</title></head><body><div class="chapter">
<h1 class="title"><a id="pkgtools"></a>Chapter 8. The Debian package management tools</h1>
<div class="toc"><dl><dt><a href="#pkgprogs">8.1. What programs does Debian provide for managing its packages?</a>
</dt></dl></div>
<div class="section"><h2 class="title"><a id="pkgprogs"></a>8.1.&#160;What programs does Debian provide for managing
its packages?</h2><p>There are multiple tools that are used to manage Debian packages, from graphic or text-based
interfaces to the low level tools. See Section 8.2, \u201cDebian claims to be able to update a running program; how is
this accomplished?\u201d for more.</p>
<h3 class="title"><a id="dpkg"></a>8.1.1.&#160;dpkg</h3><p>This is the main package management program.</p></div>
<div class="section"><h2 class="title"><a id="uptodate"></a>8.2.&#160;Keeping your system current</h2>
<p>Run apt upgrade regularly to stay current.</p></div>
</div></body></html>"""
REFERENCE_PAGE = """<html><body><h1>Chapter 2. Debian package management</h1>
<p>APT fetches packages from the archive and resolves their dependencies for you.</p></body></html>"""


@pytest.fixture(scope="module")
def faq_set():
    return loaded_script("debian_faq_set")


def test_each_question_is_judged_against_its_own_answer_and_never_appears_in_the_corpus(faq_set, tmp_path):
    faq, reference = tmp_path / "faq", tmp_path / "reference"
    faq.mkdir()
    reference.mkdir()
    (faq / "pkgtools.en.html").write_text(FAQ_PAGE, encoding="utf-8")
    (reference / "ch02.en.html").write_text(REFERENCE_PAGE, encoding="utf-8")
    built = faq_set.build(faq, reference)
    question = "What programs does Debian provide for managing its packages?"
    assert built.queries == [question]  # "Keeping your system current" asks nothing
    (answer,) = built.relevant[built.query_ids[0]]
    text = built.corpus[built.corpus_ids.index(answer)]
    assert text.startswith("There are multiple tools") and "This is the main package management program." in text
    assert "See Section 8.2 for more." in text  # the cross-reference keeps its number, not another question's title
    assert not any(question in passage or "update a running program" in passage for passage in built.corpus)
    assert "Run apt upgrade regularly to stay current." in built.corpus  # an answer to no question stays a passage
    assert any(passage.startswith("Chapter 2. Debian package management APT fetches") for passage in built.corpus)


@pytest.mark.parametrize("case", BAD_INPUT)
def test_bad_input_is_one_line(tmp_path, case):
    check_bad_input_is_one_line("debian_faq_set", tmp_path, case, ("--faq-deb", "--reference-deb"))
