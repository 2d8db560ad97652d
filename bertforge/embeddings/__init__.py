"""Vectors from a BERT encoder: sentence, word and token embeddings, any mix of layers."""
