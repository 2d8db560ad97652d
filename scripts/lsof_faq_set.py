"""A third technical corpus with real user questions: lsof's FAQ, man page and quick start, as a BEIR folder.

    python scripts/lsof_faq_set.py                 # -> runs/retrieval/lsof-faq (apt-get download lsof)
    python scripts/lsof_faq_set.py --deb lsof_*.deb

Python's and Debian's FAQs are about text all-MiniLM-L6-v2's training pairs already cover; lsof's is narrower (UNIX
dialects, kernel structures, device caches). The questions are its FAQ's numbered headings that end in a question
mark ("Why does lsof report 'can't stat()' for some NFS files?"), 238 of them; the corpus is the FAQ's answers with
their headings (and the table of contents, which lists them) taken out, plus the man page (rendered by `man`) and
00QUICKSTART, ~69,000 words in passages of whole paragraphs as the Python set is. A question's relevant passages are
its answer's. The package comes from the Debian archive with `apt-get download`: no dataset hub.
"""
from __future__ import annotations

import argparse
import gzip
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from bertforge.tasks.retrieval.reader import RetrievalSet  # noqa: E402
from python_faq_set import FaqSet, check_output, extract, write_beir_folder  # noqa: E402

PACKAGE = ("lsof", "usr/share/doc/lsof")
MAN_PAGE = "usr/share/man/man8/lsof.8.gz"  # beside the docs in the package
HEADING = re.compile(r"^(\d+(?:\.\d+)+)\t(.*)$")  # "3.1.1\tWhy can't Configure determine the UNIX dialect version?"
OVERSTRIKE = re.compile(r".\x08")  # man's bold and underline when its output is not a terminal


def sections(faq: str) -> list[tuple[str, str, list[str]]]:
    """(number, heading, the answer's lines) for every numbered heading after the table of contents (which lists the
    same headings first); a heading wrapped onto tab-indented lines before its question mark is joined."""
    first = faq.index("\n1.0\t")
    lines = faq[faq.index("\n1.0\t", first + 1) + 1:].splitlines()  # the second "1.0": the body's first section
    found: list[tuple[str, str, list[str]]] = []
    position = 0
    while position < len(lines):
        match = HEADING.match(lines[position])
        if match:
            heading = match.group(2).strip()
            while (not heading.endswith("?") and position + 1 < len(lines) and lines[position + 1].startswith("\t")
                   and lines[position + 1].strip()):
                position += 1
                heading += " " + lines[position].strip()
            found.append((match.group(1), " ".join(heading.split()), []))
        elif found:
            found[-1][2].append(lines[position])
        position += 1
    return found


def paragraphs(lines: list[str]) -> list[str]:
    """Blank-line blocks, each one line of words."""
    blocks, block = [], []
    for line in [*lines, ""]:
        if line.strip():
            block.append(line.strip())
        elif block:
            blocks.append(" ".join(block))
            block = []
    return blocks


def man_text(page: Path) -> str:
    """A man page as plain text (man-db's `man -l`, 80 columns, overstrikes removed)."""
    try:
        shown = subprocess.run(["man", "-l", str(page)], capture_output=True, text=True, check=True,
                               env={**os.environ, "MANWIDTH": "80", "MAN_DISABLE_SECCOMP": "1"}).stdout
    except (OSError, subprocess.CalledProcessError) as error:
        raise SystemExit(f"man -l {page} failed ({error.__class__.__name__}): man-db is needed to render it") from None
    return OVERSTRIKE.sub("", shown)


def build(docs: Path, man_page: Path) -> RetrievalSet:
    """The FAQ's questions against every passage of its answers, the man page and the quick start."""
    built = FaqSet()
    faq = gzip.open(docs / "00FAQ.gz", "rt", encoding="utf-8", errors="replace").read()
    for number, heading, lines in sections(faq):
        built.add_answer(f"q-{number}", heading, f"faq-{number}", paragraphs(lines))
    quick_start = gzip.open(docs / "00QUICKSTART.gz", "rt", encoding="utf-8", errors="replace").read()
    for name, text in (("man", man_text(man_page)), ("quickstart", quick_start)):
        built.add_passages(name, paragraphs(text.splitlines()))
    return built.retrieval_set()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", type=Path, default=ROOT / "runs" / "retrieval" / "lsof-faq")
    parser.add_argument("--deb", type=Path, help="a downloaded lsof .deb (default: apt-get download)")
    args = parser.parse_args()
    check_output(args.output)
    with tempfile.TemporaryDirectory() as folder:
        docs = extract(args.deb, Path(folder), *PACKAGE)
        retrieval_set = build(docs, docs.parents[3] / MAN_PAGE)
    write_beir_folder(args.output, retrieval_set)


if __name__ == "__main__":
    main()
