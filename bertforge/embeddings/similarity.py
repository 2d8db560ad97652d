"""Sentence vectors compared: scaled to unit length so that a dot product is a cosine."""
from __future__ import annotations

import numpy as np


def l2_normalized(vectors: np.ndarray) -> np.ndarray:
    """(n, dim) vectors scaled to length 1, so dot products are cosines; a zero vector stays zero."""
    return vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
