"""scripts/lsof_faq_set.py: lsof's plain-text FAQ to questions, answers and passages (the download is not run)."""
from __future__ import annotations

import gzip
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
SCRIPT = SCRIPTS / "lsof_faq_set.py"

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
    sys.path.insert(0, str(SCRIPTS))  # the script imports python_faq_set beside it
    spec = importlib.util.spec_from_file_location("lsof_faq_set", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    sys.path.remove(str(SCRIPTS))


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


@pytest.mark.parametrize("case", ["missing deb", "not a deb", "output is a file"])
def test_bad_input_is_one_line(tmp_path, case):
    deb, output = tmp_path / "lsof.deb", tmp_path / "out"
    if case == "not a deb":
        deb.write_text("not an archive")
    if case == "output is a file":
        output.write_text("keep me")
    result = subprocess.run([sys.executable, str(SCRIPT), "--deb", str(deb), "--output", str(output)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert case != "output is a file" or output.read_text() == "keep me"
