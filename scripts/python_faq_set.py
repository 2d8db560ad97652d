"""A technical corpus with real user questions: Python's documentation and its FAQ, as a BEIR folder.

    python scripts/python_faq_set.py                       # -> runs/retrieval/python-faq
    python scripts/python_faq_set.py --deb python3.11-doc_*.deb --output DIR

Issue 23 asks adapt to pay on "a technical corpus with real user questions". Python's FAQ is
such a set: questions people asked often enough to be written down ("How do I make a Python
script executable on Unix?"), each answered by the section under it. The corpus is the FAQ's
answers with the question headings taken out, plus the tutorial and the HOWTOs (the same
domain, ~150,000 words in all), cut into passages of whole paragraphs; the queries are the
question headings; a question's relevant passages are its answer's. A model never sees a
question while it adapts: `bertforge adapt DIR/corpus.jsonl --eval DIR` trains on the
passages alone.

The text comes from the Debian package python3.11-doc (the reStructuredText sources it ships
under html/_sources), fetched with `apt-get download` from the Debian archive: no dataset hub.
Inline markup is reduced to its text (`:func:`len`` -> len, `name <url>`_ -> name, `~a.b` -> a.b), directive
lines dropped, code kept as text: bertforge.markup's reStructuredText reader, which adapt uses on .rst files.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bertforge.markup import rst_sections  # noqa: E402
from bertforge.tasks.retrieval.reader import RetrievalSet, write_retrieval_set  # noqa: E402

PACKAGE = "python3.11-doc"
SOURCES = "usr/share/doc/python3.11/html/_sources"
PARTS = ("faq", "tutorial", "howto")  # the FAQ's answers, then same-domain text that answers no question
PASSAGE_WORDS = 150  # paragraphs are joined into passages of at most this many words (a longer one stays whole)


def passages(paragraphs: list[str]) -> list[str]:
    """Whole paragraphs joined into passages of at most PASSAGE_WORDS words."""
    joined, current = [], []
    for paragraph in paragraphs:
        if current and len(" ".join(current + [paragraph]).split()) > PASSAGE_WORDS:
            joined.append(" ".join(current))
            current = []
        current.append(paragraph)
    if current:
        joined.append(" ".join(current))
    return [text for text in joined if len(text.split()) >= 3]


class FaqSet:
    """A BEIR set as a FAQ script builds it: passages under ids, and the questions, each judged against its own
    answer's passages (the Python, Debian and lsof sets)."""

    def __init__(self) -> None:
        self.query_ids: list[str] = []
        self.queries: list[str] = []
        self.corpus_ids: list[str] = []
        self.corpus: list[str] = []
        self.relevant: dict[str, list[str]] = {}

    def add_passages(self, prefix: str, paragraphs: list[str]) -> list[str]:
        """`passages(paragraphs)` under the ids PREFIX-0, PREFIX-1, ...; returns the ids."""
        texts = passages(paragraphs)
        ids = [f"{prefix}-{piece}" for piece in range(len(texts))]
        self.corpus_ids += ids
        self.corpus += texts
        return ids

    def add_answer(self, query_id: str, heading: str, prefix: str, paragraphs: list[str]) -> None:
        """A section's passages, and its heading as question `query_id` judged against them when it asks one (ends
        in a question mark) and has a passage."""
        ids = self.add_passages(prefix, paragraphs)
        if heading.endswith("?") and ids:
            self.query_ids.append(query_id)
            self.queries.append(heading)
            self.relevant[query_id] = ids

    def retrieval_set(self) -> RetrievalSet:
        return RetrievalSet(query_ids=self.query_ids, queries=self.queries, corpus_ids=self.corpus_ids,
                            corpus=self.corpus, relevant=self.relevant)


def build(sources: Path) -> RetrievalSet:
    """The FAQ's questions against every passage of the FAQ's answers, the tutorial and the HOWTOs."""
    built = FaqSet()
    for part in PARTS:
        for path in sorted((sources / part).glob("*.rst.txt")):
            page = path.name.removesuffix(".rst.txt")
            for number, section in enumerate(rst_sections(path.read_text(encoding="utf-8"))):
                prefix = f"{part}-{page}-{number}"
                if part == "faq":
                    built.add_answer(f"q-{page}-{number}", section.heading, prefix, section.paragraphs)
                else:
                    built.add_passages(prefix, section.paragraphs)
    return built.retrieval_set()


def extract(deb: Path | None, into: Path, package: str = PACKAGE, holds: str = SOURCES) -> Path:
    """The folder `holds` of the Debian `package`, unpacked under `into` (downloaded with apt-get unless --deb
    names the .deb)."""
    if deb is None:
        run_tool(["apt-get", "download", package], into, f"could not download {package} (a Debian or Ubuntu "
                 "machine with its package lists is needed); download the .deb elsewhere and pass --deb FILE")
        deb = next(into.glob(f"{package}_*.deb"))
    elif not deb.is_file():
        raise SystemExit(f"--deb {deb}: no such file; give the {package} .deb that apt-get download fetched")
    run_tool(["dpkg-deb", "-x", str(deb), str(into / "root")], into,
             f"could not unpack {deb}: is it the {package} .deb? (dpkg-deb is needed)")
    if not (into / "root" / holds).is_dir():
        raise SystemExit(f"{deb} holds no {holds}: give the {package} package")
    return into / "root" / holds


def run_tool(command: list[str], folder: Path, advice: str) -> None:
    """Run an archive tool; a missing tool or its failure is one line (SystemExit) with the advice."""
    try:
        subprocess.run(command, cwd=folder, check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError) as error:
        raise SystemExit(f"{' '.join(command[:2])} failed ({error.__class__.__name__}): {advice}") from None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", type=Path, default=ROOT / "runs" / "retrieval" / "python-faq")
    parser.add_argument("--deb", type=Path, help=f"a downloaded {PACKAGE} .deb (default: apt-get download)")
    args = parser.parse_args()
    check_output(args.output)
    with tempfile.TemporaryDirectory() as temporary:
        retrieval_set = build(extract(args.deb, Path(temporary)))
    write_beir_folder(args.output, retrieval_set)


def check_output(output: Path) -> None:
    """SystemExit with one line when --output, or the nearest of its parents that exists, is a file (checked before
    any download: a parent that was a file ended the run in a traceback when the set was written)."""
    if output.exists() and not output.is_dir():
        raise SystemExit(f"--output {output} is a file; give a folder for the BEIR set")
    existing = next(parent for parent in output.absolute().parents if parent.exists())
    if not existing.is_dir():
        raise SystemExit(f"--output {output}: {existing} is a file; give a folder for the BEIR set")


def write_beir_folder(output: Path, retrieval_set: RetrievalSet) -> None:
    """The set as a BEIR folder (corpus.jsonl, queries.jsonl, qrels/test.tsv), and one line saying what it holds."""
    (output / "qrels").mkdir(parents=True, exist_ok=True)
    write_retrieval_set(output, retrieval_set)
    (output / "qrels.tsv").replace(output / "qrels" / "test.tsv")  # BEIR's own place for it
    words = sum(len(text.split()) for text in retrieval_set.corpus)
    print(f"{output}: {len(retrieval_set.queries)} questions, {len(retrieval_set.corpus):,} passages, "
          f"{words:,} words; adapt with: bertforge adapt {output / 'corpus.jsonl'} --eval {output}")


if __name__ == "__main__":
    main()
