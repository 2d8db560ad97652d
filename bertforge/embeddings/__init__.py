"""Vectors from a BERT encoder: sentence, word and token embeddings, any mix of layers."""
from typing import Literal

# The choices the command line offers, here and not in pooling.py / options.py (torch) so that building
# the command line's parser needs no torch.
# One mode; a sentence-transformers folder may also ask for several joined by "+".
Pooling = Literal["cls", "mean", "max", "mean_sqrt_len_tokens", "weightedmean", "lasttoken", "pooler"]
# The poolings a sentence-transformers folder can name (its Pooling module): what search and
# serving accept, since their vectors must be reproducible from the folder alone.
SentencePooling = Literal["cls", "mean", "max", "mean_sqrt_len_tokens", "weightedmean", "lasttoken"]
LayerCombine = Literal["mean", "concat"]  # how a list of layers becomes one vector per token
