"""scripts/python_faq_set.py: reStructuredText to questions, answers and passages (the Debian download itself is not run)."""
from __future__ import annotations

import pytest

from faq_set_scripts import BAD_INPUT, check_bad_input_is_one_line, loaded_script


@pytest.fixture(scope="module")
def faq_set():
    return loaded_script("python_faq_set")


FAQ = """\
:tocdepth: 2

===========
Library FAQ
===========

.. only:: html

   .. contents::

General Questions
=================

.. _faq-label:

How do I find a module?
-----------------------

Check :mod:`the index <sys>` first, or read ``sys.path``.
See `the docs <https://docs.python.org/>`_ for :func:`~importlib.import_module`.

.. note::
   :class: short

   Modules are cached.

Is Python fast?
---------------

Fast enough.
"""


def test_passages_join_whole_paragraphs_up_to_the_word_limit(faq_set, monkeypatch):
    monkeypatch.setattr(faq_set, "PASSAGE_WORDS", 6)
    assert faq_set.passages(["one two three", "four five six", "seven eight nine ten eleven twelve thirteen", "hi"]) \
        == ["one two three four five six", "seven eight nine ten eleven twelve thirteen"]  # "hi": under 3 words


def test_questions_are_judged_against_their_own_answer_and_never_appear_in_the_corpus(faq_set, tmp_path):
    (tmp_path / "faq").mkdir()
    (tmp_path / "faq" / "library.rst.txt").write_text(FAQ, encoding="utf-8")
    (tmp_path / "tutorial").mkdir()
    (tmp_path / "tutorial" / "intro.rst.txt").write_text("Intro\n=====\n\nWhat is this? A tutorial about it.\n",
                                                          encoding="utf-8")
    built = faq_set.build(tmp_path)
    assert built.queries == ["How do I find a module?"]  # "Is Python fast?" has no passage of 3 words
    (answer,) = built.relevant[built.query_ids[0]]
    assert built.corpus[built.corpus_ids.index(answer)].startswith("Check the index first")
    assert "What is this? A tutorial about it." in built.corpus  # the tutorial's question is no FAQ query
    assert not any("How do I find a module?" in text for text in built.corpus)


@pytest.mark.parametrize("case", BAD_INPUT)
def test_bad_input_is_one_line(tmp_path, case):
    check_bad_input_is_one_line("python_faq_set", tmp_path, case, ("--deb",))
