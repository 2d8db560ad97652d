"""Extractive question answering on SQuAD v1.1 / v2.0: squad (JSON in and out), features (windows),
answers (n-best spans), scoring (official EM/F1), task (what fine-tuning and predict call)."""
