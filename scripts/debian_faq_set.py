"""A second technical corpus with real user questions: the Debian FAQ and the Debian Reference, as a BEIR folder.

    python scripts/debian_faq_set.py                       # -> runs/retrieval/debian-faq
    python scripts/debian_faq_set.py --faq-deb debian-faq_*.deb --reference-deb debian-reference-en_*.deb

Python's FAQ (scripts/python_faq_set.py) is the set issue 23's recipe was measured on; this one was not used to
choose anything, so it shows what a user's own technical corpus would get. The questions are the Debian FAQ's
(package debian-faq: "How can I install a package that I have downloaded?", "Why does Debian not include the
latest kernel?"): its section headings that end in a question mark. The corpus is the FAQ's answers with their
headings (and each page's table of contents, which lists them) taken out, plus the Debian Reference (package
debian-reference-en: the same domain, answering no question of its own), ~100,000 words, cut into passages of
whole paragraphs as the Python set is. A question's relevant passages are its answer's. Both packages come from the
Debian archive with `apt-get download`: no dataset hub. HTML is read by bertforge.markup, as adapt reads it.
"""
from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from bertforge.markup import html_blocks  # noqa: E402
from bertforge.tasks.retrieval.reader import RetrievalSet  # noqa: E402
from python_faq_set import FaqSet, check_output, extract, write_beir_folder  # noqa: E402

FAQ = ("debian-faq", "usr/share/doc/debian/FAQ")
REFERENCE = ("debian-reference-en", "usr/share/debian-reference")
# Each question is an <h2> of DocBook's HTML, numbered ("8.1.\xa0What programs does Debian provide ...?"); its
# answer is all that follows it up to the next <h2> (its <h3> subsections included).
QUESTION = re.compile(r'<h2 class="title">')
NUMBERING = re.compile(r"^[\d.]+\s*")
# DocBook writes a cross-reference as the section's number and title: 'see Section 4.4, "How source code compatible
# is Debian with other Unix systems?"' (262 of them). The title is another question's text, so the number alone stays,
# as a question's own heading is taken out of its answer.
CROSS_REFERENCE = re.compile(r"((?:Section|Chapter) [\d.]*\d),\s*\u201c[^\u201d]*\u201d")


def sections(page: str) -> list[tuple[str, list[str]]]:
    """(heading, its answer's paragraphs) for every <h2> of a DocBook page; the part before the first (the
    chapter's title and its table of contents, which lists the questions) is left out."""
    found = []
    starts = [match.start() for match in QUESTION.finditer(page)] + [len(page)]
    for start, end in zip(starts, starts[1:]):
        heading, *blocks = html_blocks(f"<html><body>{page[start:end]}</body></html>")  # the <h2> is the first block
        found.append((NUMBERING.sub("", heading), [CROSS_REFERENCE.sub(r"\1", block) for block in blocks]))
    return found


def build(faq: Path, reference: Path) -> RetrievalSet:
    """The FAQ's questions against every passage of its answers and of the Debian Reference."""
    built = FaqSet()
    for path in sorted(faq.glob("*.en.html")):
        page = path.name.removesuffix(".en.html")
        for number, (heading, paragraphs) in enumerate(sections(path.read_text(encoding="utf-8"))):
            built.add_answer(f"q-{page}-{number}", heading, f"faq-{page}-{number}", paragraphs)
    for path in sorted(reference.glob("*.en.html")):
        page = path.name.removesuffix(".en.html")
        built.add_passages(f"reference-{page}", html_blocks(path.read_text(encoding="utf-8")))
    return built.retrieval_set()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", type=Path, default=ROOT / "runs" / "retrieval" / "debian-faq")
    parser.add_argument("--faq-deb", type=Path, help="a downloaded debian-faq .deb (default: apt-get download)")
    parser.add_argument("--reference-deb", type=Path,
                        help="a downloaded debian-reference-en .deb (default: apt-get download)")
    args = parser.parse_args()
    check_output(args.output)
    with tempfile.TemporaryDirectory() as faq_folder, tempfile.TemporaryDirectory() as reference_folder:
        retrieval_set = build(extract(args.faq_deb, Path(faq_folder), *FAQ),
                              extract(args.reference_deb, Path(reference_folder), *REFERENCE))
    write_beir_folder(args.output, retrieval_set)


if __name__ == "__main__":
    main()
