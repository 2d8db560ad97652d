"""Sequence classification: labelled tables in (reader), the label space (labels), windows of ids (windows),
fine-tuning and prediction (task), the TF-IDF baseline (tfidf)."""
