"""Sequence classification: labelled tables in (reader), windows and metrics (task), the TF-IDF baseline (tfidf)."""
