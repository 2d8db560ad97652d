"""Token classification (NER): CoNLL files in and out (conll), word-level labels and seqeval F1 (task)."""
