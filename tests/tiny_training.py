"""A tiny classifier and a stream of random batches: enough for the training loop's rules in a second."""
import torch

from bertforge import BertConfig, BertForSequenceClassification
from bertforge.train.batches import ShuffledBatches


def tiny_classifier(dropout: float = 0.1):
    torch.manual_seed(0)
    config = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, id2label={0: "no", 1: "yes"}, hidden_dropout_prob=dropout,
                        attention_probs_dropout_prob=dropout)
    return BertForSequenceClassification(config)


def random_batches():
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 50, (64, 8), generator=generator)
    labels = (ids[:, 0] > 25).long()
    collate = lambda idx: {"input_ids": ids[idx], "attention_mask": torch.ones(len(idx), 8, dtype=torch.long),
                           "labels": labels[idx]}
    return ShuffledBatches(64, 16, collate)
