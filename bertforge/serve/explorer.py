"""What the explorer page shows, computed on the model thread: attention maps and words in context."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..embeddings.embed import Embedder
from ..embeddings.similarity import l2_normalized
from ..embeddings.words import find_occurrences
from ..engine.devices import to_device

# Attention for longer inputs would be layers x heads x n^2 numbers (6 x 12 x 128^2 = 1.2M for
# MiniLM at 128 tokens): too much for a page to draw or a response to carry.
ATTENTION_MAX_TOKENS = 64
ATTENTION_DECIMALS = 4
# A word in context: one point per occurrence, and an n x n table of their cosines on the page.
WORD_MAX_POINTS = 64


@dataclass
class AttentionMaps:
    tokens: list[str]
    attentions: np.ndarray  # (layers, heads, tokens, tokens): row q is where token q attends, rows sum to 1
    word_ids: list[int | None]  # per token, the word it is a piece of (None for [CLS]/[SEP])
    truncated: bool


@torch.inference_mode()
def attention_maps(embedder: Embedder, text: str, max_tokens: int = ATTENTION_MAX_TOKENS) -> AttentionMaps:
    """Every layer's and head's attention probabilities for one text, cut to max_tokens tokens.

    word_ids are the tokenizer's words (punctuation is a word of its own, as BERT splits it), so the
    page can tell a link between two words from one among the pieces of a word.
    """
    full_length = len(embedder.tokenizer(text)["input_ids"])
    encoded = embedder.tokenizer([text], truncation=True, max_length=max_tokens, return_tensors="pt")
    word_ids = encoded.word_ids(0)
    encoded = to_device(encoded, embedder.device)
    output = embedder.model(encoded["input_ids"], attention_mask=encoded["attention_mask"],
                            token_type_ids=encoded["token_type_ids"], output_attentions=True)
    attentions = torch.stack(output.attentions)[:, 0].float().cpu().numpy()  # (layers, heads, seq, seq)
    tokens = embedder.tokenizer.convert_ids_to_tokens(encoded["input_ids"][0].tolist())
    return AttentionMaps(tokens, attentions, word_ids, truncated=full_length > max_tokens)


@dataclass
class WordInContext:
    occurrences: list[dict]  # per point: sentence (index), label ("2", or "2.1" of several), context
    cosine: np.ndarray  # (points, points): cosine similarity of the word's vectors
    points: np.ndarray  # (points, 2): the vectors' first two principal components
    explained_variance: list[float]  # share of the variance each component holds


def word_in_context(embedder: Embedder, word: str, sentences: list[str]) -> WordInContext:
    """The in-context vector of every occurrence of `word` in the sentences, compared pairwise and mapped to 2-D.

    Occurrences are found as `bertforge senses` finds them (`find_occurrences`), vectors as `word_vector`
    computes them. Raises ValueError naming a sentence that lacks the word or cuts it off, or for more
    than WORD_MAX_POINTS occurrences.
    """
    from sklearn.decomposition import PCA  # here: sklearn and scipy under it are most of a second of serve's start

    vectors, occurrences = [], []
    for number, sentence in enumerate(sentences, start=1):
        found = find_occurrences([sentence], word)
        if not found:
            raise ValueError(f"sentence {number}: {word.strip()!r} is not in the sentence {sentence!r} "
                             "(matched as a whole word, ignoring case)")
        if len(occurrences) + len(found) > WORD_MAX_POINTS:
            raise ValueError(f"{word.strip()!r} occurs more than {WORD_MAX_POINTS} times in these sentences, more "
                             "points than the page can draw; give fewer or shorter sentences")
        try:
            vectors.append(embedder.span_vectors(sentence, [(o.start, o.end) for o in found]))
        except ValueError as error:
            raise ValueError(f"sentence {number}: {error}") from None
        occurrences += [{"sentence": number - 1, "label": str(number) if len(found) == 1 else f"{number}.{k}",
                         "context": o.context(width=len(sentence))} for k, o in enumerate(found, start=1)]
    vectors = np.concatenate(vectors)  # (points, dim)
    unit = l2_normalized(vectors)
    pca = PCA(n_components=2, random_state=0)  # deterministic, as seed 003's picture (random_state=42 there)
    points = pca.fit_transform(vectors)
    return WordInContext(occurrences, cosine=unit @ unit.T, points=points,
                         explained_variance=pca.explained_variance_ratio_.tolist())
