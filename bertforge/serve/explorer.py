"""What the explorer page shows, computed on the model thread: attention maps and words in context."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..embeddings.embed import Embedder
from ..embeddings.similarity import l2_normalized
from ..engine.devices import to_device

# Attention for longer inputs would be layers x heads x n^2 numbers (6 x 12 x 128^2 = 1.2M for
# MiniLM at 128 tokens): too much for a page to draw or a response to carry.
ATTENTION_MAX_TOKENS = 64
ATTENTION_DECIMALS = 4


@dataclass
class AttentionMaps:
    tokens: list[str]
    attentions: np.ndarray  # (layers, heads, tokens, tokens): row q is where token q attends, rows sum to 1
    truncated: bool


@torch.inference_mode()
def attention_maps(embedder: Embedder, text: str, max_tokens: int = ATTENTION_MAX_TOKENS) -> AttentionMaps:
    """Every layer's and head's attention probabilities for one text, cut to max_tokens tokens."""
    full_length = len(embedder.tokenizer(text)["input_ids"])
    encoded = embedder.tokenizer([text], truncation=True, max_length=max_tokens, return_tensors="pt")
    encoded = to_device(encoded, embedder.device)
    output = embedder.model(encoded["input_ids"], attention_mask=encoded["attention_mask"],
                            token_type_ids=encoded["token_type_ids"], output_attentions=True)
    attentions = torch.stack(output.attentions)[:, 0].float().cpu().numpy()  # (layers, heads, seq, seq)
    tokens = embedder.tokenizer.convert_ids_to_tokens(encoded["input_ids"][0].tolist())
    return AttentionMaps(tokens, attentions, truncated=full_length > max_tokens)


@dataclass
class WordInContext:
    cosine: np.ndarray  # (sentences, sentences): cosine similarity of the word's vectors
    points: np.ndarray  # (sentences, 2): the vectors' first two principal components
    explained_variance: list[float]  # share of the variance each component holds


def word_in_context(embedder: Embedder, word: str, sentences: list[str]) -> WordInContext:
    """The in-context vector of `word` in each sentence (`Embedder.word_vector`), compared pairwise and mapped to 2-D.

    Raises ValueError (from word_vector) naming a sentence that lacks the word.
    """
    from sklearn.decomposition import PCA  # here: sklearn and scipy under it are most of a second of serve's start

    vectors = []
    for number, sentence in enumerate(sentences, start=1):
        try:
            vectors.append(embedder.word_vector(sentence, word))
        except ValueError as error:
            raise ValueError(f"sentence {number}: {error}") from None
    vectors = np.stack(vectors)  # (sentences, dim)
    unit = l2_normalized(vectors)
    pca = PCA(n_components=2, random_state=0)  # deterministic, as seed 003's picture (random_state=42 there)
    points = pca.fit_transform(vectors)
    return WordInContext(cosine=unit @ unit.T, points=points, explained_variance=pca.explained_variance_ratio_.tolist())
