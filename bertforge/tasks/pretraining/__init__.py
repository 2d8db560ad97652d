"""Pretraining (MLM + NSP): raw text → tokenized shards → sentence pairs → masked instances → batches
(corpus, shards, pairs, masking, dataset), the recipe that trains on them, and fill-mask."""
from .corpus import read_documents, split_lines, split_sentences
from .dataset import PretrainingConfig, PretrainingDataset, collate
from .masking import mask_tokens
from .pairs import PairPlan, Segment, SentencePair, build_pair, make_sentence_pairs, plan_sentence_pairs
from .shards import TokenizedCorpus, prepare_corpus, split_documents, vocab_fingerprint

__all__ = [
    "read_documents", "split_sentences", "split_lines",
    "prepare_corpus", "TokenizedCorpus", "split_documents", "vocab_fingerprint",
    "make_sentence_pairs", "plan_sentence_pairs", "build_pair", "SentencePair", "PairPlan", "Segment",
    "mask_tokens",
    "PretrainingConfig", "PretrainingDataset", "collate",
]
