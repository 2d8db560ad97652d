"""Masked-LM corruption of one sequence, as create_masked_lm_predictions does it (80% [MASK], 10% random, 10% kept)."""
import functools
import re
from collections.abc import Iterable, Sequence

import numpy as np

from ...models.heads import IGNORE_INDEX  # label of unmasked positions: the losses skip it
from ...validation import checked

_BRACKETED = re.compile(r"\[\w+\]")  # [PAD] [UNK] [CLS] [SEP] [MASK] [unused0]...: tokens no text holds


def check_masking_args(mlm_probability: float, max_predictions_per_seq: int) -> None:
    """Raise UsageError (a ValueError) for a masking rate or prediction cap that cannot work."""
    checked("mlm_probability", mlm_probability, float)
    checked("max_predictions_per_seq", max_predictions_per_seq)


def mask_tokens(input_ids, rng: np.random.Generator, vocab_size: int, mask_token_id: int, special_ids: Iterable[int],
                mlm_probability: float = 0.15, max_predictions_per_seq: int = 20, whole_word: bool = False,
                word_starts=None, random_token_ids=None,
                vocab_tokens: Sequence[str] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(masked input ids, labels), both (seq,) int64, for one sequence of token ids (seq,).

    Positions holding `special_ids` ([CLS], [SEP], [PAD]) are never chosen. The number chosen is
    min(max_predictions_per_seq, max(1, round(candidates * mlm_probability))), 15% of the real tokens
    (the original counts [CLS] and the [SEP]s too: 17.63 a sequence against 17.54 on Austen at 128); each chosen
    position becomes [MASK] (80%), a random token (10%) or stays (10%), and its label is the
    original id; every other label is -100. whole_word=True chooses words instead: `word_starts`
    (seq,) bool marks the first piece of each word (False for "##" pieces); a word never spans a
    special token, and a word that would overshoot the count is skipped, as in the original.
    Random tokens come from `random_token_ids`; by default, given the vocabulary's `vocab_tokens` (in id order),
    from `random_replacement_ids` (every token but the bracketed ones, as PretrainingDataset draws them), and
    given its size alone (which names no token) from every id below vocab_size except special_ids and
    mask_token_id. Raises ValueError for bad rates, a missing word_starts, or vocab_tokens of another size.
    """
    check_masking_args(mlm_probability, max_predictions_per_seq)
    input_ids, special_ids = np.asarray(input_ids, dtype=np.int64), frozenset(special_ids)
    if vocab_tokens is not None and len(vocab_tokens) != vocab_size:
        raise ValueError(f"vocab_tokens holds {len(vocab_tokens)} tokens but vocab_size is {vocab_size}; pass the "
                         "vocabulary's tokens in id order")
    if whole_word and (word_starts is None or len(word_starts) != len(input_ids)):
        raise ValueError("whole_word=True needs word_starts: a bool per token, False for '##' continuation pieces")
    is_special = np.zeros(len(input_ids), dtype=bool)
    for special_id in special_ids:  # a handful of ids: cheaper than np.isin's set machinery
        is_special |= input_ids == special_id
    candidates = np.flatnonzero(~is_special)
    masked_ids, labels = input_ids.copy(), np.full_like(input_ids, IGNORE_INDEX)
    if len(candidates) == 0:
        return masked_ids, labels
    num_to_predict = min(max_predictions_per_seq, max(1, round(len(candidates) * mlm_probability)))
    if whole_word:
        chosen = _choose_words(candidates, np.asarray(word_starts, dtype=bool), num_to_predict, rng)
    else:
        chosen = rng.choice(candidates, size=num_to_predict, replace=False)

    labels[chosen] = input_ids[chosen]
    # One uniform draw per position splits 80 / 10 / 10 like the original's two nested coin flips.
    draw = rng.random(len(chosen))
    masked_ids[chosen[draw < 0.8]] = mask_token_id
    replaced = chosen[draw >= 0.9]
    if random_token_ids is None:
        random_token_ids = _default_random_ids(vocab_size if vocab_tokens is None else tuple(vocab_tokens),
                                               special_ids | {mask_token_id})
    random_token_ids = np.asarray(random_token_ids)
    masked_ids[replaced] = random_token_ids[rng.integers(len(random_token_ids), size=len(replaced))]
    return masked_ids, labels


def _choose_words(candidates: np.ndarray, word_starts: np.ndarray, num_to_predict: int,
                  rng: np.random.Generator) -> np.ndarray:
    """Positions of whole words taken in random order while they fit in num_to_predict."""
    # A piece joins the previous one when it does not start a word and directly follows it,
    # so a "##" piece right after [SEP] is a word of its own.
    starts = word_starts[candidates]
    starts[0] = True
    starts[1:] |= np.diff(candidates) != 1
    word_of_candidate = np.cumsum(starts) - 1
    sizes = np.bincount(word_of_candidate).tolist()
    chosen, count = np.zeros(len(sizes), dtype=bool), 0
    for word in rng.permutation(len(sizes)).tolist():
        if count >= num_to_predict:
            break
        if count + sizes[word] > num_to_predict:  # the original skips a word that would overshoot
            continue
        chosen[word] = True
        count += sizes[word]
    return candidates[chosen[word_of_candidate]]


def random_replacement_ids(vocab_tokens: Sequence[str]) -> np.ndarray:
    """The ids the 10% random replacements are drawn from: every token of the vocabulary (in id order) but the
    bracketed ones, [CLS], [MASK], [UNK], [unusedN]...: the model never sees them in text, so predicting the
    original from one teaches nothing (the original drew from the whole vocabulary)."""
    return np.array([i for i, token in enumerate(vocab_tokens) if not _BRACKETED.fullmatch(token)], dtype=np.int64)


@functools.lru_cache(maxsize=8)
def _default_random_ids(vocab: int | tuple[str, ...], excluded: frozenset) -> np.ndarray:
    """mask_tokens' pool without one given: `random_replacement_ids` of the vocabulary's tokens; for a vocabulary
    known by its size alone, every id but `excluded` (the special ids and [MASK]: the only ids it can name)."""
    if not isinstance(vocab, int):
        return random_replacement_ids(vocab)
    ids = np.arange(vocab, dtype=np.int64)
    return ids[~np.isin(ids, list(excluded))]
