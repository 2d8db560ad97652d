"""Pretraining (MLM + NSP): raw text → tokenized shards → sentence pairs → masked instances → batches
(corpus, shards, pairs, masking, dataset), the recipe that trains on them, and fill-mask.

Names are imported on first use, so that the command line's parser, which reads `prepare`'s choices
from corpus.py, needs no torch.
"""
import importlib

_EXPORTS = {
    "read_documents": "corpus", "split_sentences": "corpus", "split_lines": "corpus",
    "prepare_corpus": "shards", "TokenizedCorpus": "shards", "split_documents": "shards", "vocab_fingerprint": "shards",
    "make_sentence_pairs": "pairs", "plan_sentence_pairs": "pairs", "build_pair": "pairs", "SentencePair": "pairs",
    "PairPlan": "pairs", "Segment": "pairs",
    "mask_tokens": "masking",
    "PretrainingConfig": "dataset", "PretrainingDataset": "dataset", "collate": "dataset",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
