"""scripts/lsof_faq_set.py: lsof's plain-text FAQ to questions, answers and passages (the download is not run)."""
from __future__ import annotations

import gzip

import pytest

from faq_set_scripts import BAD_INPUT, check_bad_input_is_one_line, loaded_script

# The shape of lsof's 00FAQ: a table of contents listing the numbered headings, then the same headings with their
# answers indented by a tab; a long question wraps onto a tab-indented line.
FAQ = """\t\tFrequently Asked Questions about lsof

Table of Contents:

1.0\tGeneral Concepts
1.1\tLsof -- what is it?
1.2.4\tWhy can't I get the sum(1) result reported in
\tREADME.lsof_<revision>?

1.0\tGeneral Concepts

1.1\tLsof -- what is it?

\tLsof is a UNIX-specific tool.  Its name stands for LiSt
\tOpen Files, and it does just that.

1.2.4\tWhy can't I get the sum(1) result reported in
\tREADME.lsof_<revision>?

\tThe calculation of sum(1) checksums varies between dialects.
"""


@pytest.fixture(scope="module")
def faq_set():
    return loaded_script("lsof_faq_set")


def test_each_question_is_judged_against_its_own_answer_and_never_appears_in_the_corpus(faq_set, tmp_path,
                                                                                         monkeypatch):
    (tmp_path / "00FAQ.gz").write_bytes(gzip.compress(FAQ.encode()))
    (tmp_path / "00QUICKSTART.gz").write_bytes(gzip.compress(b"Lsof is hard to use at first.\nIt lists files.\n"))
    monkeypatch.setattr(faq_set, "man_text", lambda page: "NAME\n       lsof - list open files\n")
    built = faq_set.build(tmp_path, tmp_path / "lsof.8.gz")
    assert built.queries == ["Lsof -- what is it?",  # "General Concepts" asks nothing; the wrapped one is joined
                             "Why can't I get the sum(1) result reported in README.lsof_<revision>?"]
    answers = [built.corpus[built.corpus_ids.index(i)] for q in built.query_ids for i in built.relevant[q]]
    assert answers == ["Lsof is a UNIX-specific tool.  Its name stands for LiSt Open Files, and it does just that.",
                       "The calculation of sum(1) checksums varies between dialects."]
    assert not any("what is it?" in passage or "README.lsof_" in passage for passage in built.corpus)
    assert "NAME lsof - list open files" in built.corpus and "Lsof is hard to use at first. It lists files." in \
        built.corpus


@pytest.mark.parametrize("case", BAD_INPUT)
def test_bad_input_is_one_line(tmp_path, case):
    check_bad_input_is_one_line("lsof_faq_set", tmp_path, case, ("--deb",))
