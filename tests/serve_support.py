"""Shared by the server's tests, its benchmark and the explorer screenshot: real sentences,
a tiny classifier folder, a trained vocabulary and an in-memory index over the sentences."""
from __future__ import annotations

import csv
import html
import re
from pathlib import Path

import pytest
import torch

from bertforge import BertConfig, BertForSequenceClassification, BertTokenizer
from bertforge.search import Index

SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
CHROMIUM = Path("/usr/bin/chromium")  # Debian's package; Playwright drives it (no `playwright install` here)
# Flags for a container: no sandbox (no user namespaces), no GPU, and nothing that calls home.
CHROMIUM_ARGS = ["--no-sandbox", "--headless=new", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run"]


def review_sentences(data_dir: Path, count: int) -> list[str]:
    """The first `count` distinct sentences (20-200 characters) of the real drug reviews, in file order."""
    sentences: dict[str, None] = {}
    with open(data_dir / "drug-reviews" / "train.tsv", encoding="utf-8", newline="") as f:
        for row in csv.DictReader(f, delimiter="\t"):
            review = " ".join(html.unescape(row["review"]).strip('" ').split())  # the file's quotes and &#039;
            for sentence in SENTENCE_END.split(review):
                if 20 <= len(sentence) <= 200:
                    sentences.setdefault(sentence)
                if len(sentences) == count:
                    return list(sentences)
    return list(sentences)


def tiny_classifier(folder: Path, vocab_from: Path, seed: int = 0) -> Path:
    """A random-weight BertForSequenceClassification (3 sentiment labels) with a real vocabulary, saved to folder."""
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=37, id2label={0: "negative", 1: "neutral", 2: "positive"},
                        problem_type="single_label_classification")
    BertForSequenceClassification(config).save_pretrained(folder, tokenizer=BertTokenizer.from_pretrained(vocab_from))
    return folder


def trained_vocabulary(folder: Path, sentences: list[str], vocab_size: int = 600) -> Path:
    """A small WordPiece vocabulary trained on the sentences: it splits words the big ones keep whole."""
    folder.mkdir(parents=True, exist_ok=True)
    corpus = folder / "corpus.txt"
    corpus.write_text("\n".join(sentences), encoding="utf-8")
    BertTokenizer.train([corpus], vocab_size=vocab_size, min_frequency=2).save_pretrained(folder)
    return folder


def sentence_index(model_dir: Path, sentences: list[str]) -> Index:
    """The real vector index over normalised vectors (exact inner product at this size, so scores are cosines)."""
    return Index.build(sentences, model_dir, kind="flat", progress=False)


@pytest.fixture(scope="module")
def sbert(minilm_dir):
    """sentence-transformers' own model on the MiniLM folder: the peer the served vectors must equal."""
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(minilm_dir), device="cpu")
