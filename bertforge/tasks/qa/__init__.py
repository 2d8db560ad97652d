"""Extractive question answering on SQuAD v1.1 / v2.0: reading, windowed features, n-best spans, EM/F1."""
