"""Masked-LM corruption: how many, which positions, 80/10/10, whole words; tolerances are 4 binomial sigmas."""
import json
import re

import numpy as np
import pytest

from bertforge.tasks.pretraining import make_sentence_pairs, mask_tokens, prepare_corpus
from bertforge.tokenization.tokenizer import BertTokenizer

PAD, CLS, SEP, MASK, VOCAB = 0, 101, 102, 103, 30522
SPECIAL = (CLS, SEP, PAD)


@pytest.fixture(scope="module")
def tokenizer(minilm_dir):
    return BertTokenizer.from_pretrained(minilm_dir)


@pytest.fixture(scope="module")
def sequences(tokenizer, data_dir, tmp_path_factory):
    """~2,500 real [CLS] A [SEP] B [SEP] sequences of up to 128 tokens from Persuasion (two passes over
    its chapters, one document each)."""
    text = (data_dir / "austen" / "persuasion.txt").read_text(encoding="utf-8")
    folder = tmp_path_factory.mktemp("persuasion")
    parts = re.split(r"\nChapter \d+\n", text)[1:]
    (folder / "chapters.jsonl").write_text("".join(json.dumps({"text": part}) + "\n" for part in parts))
    corpus = prepare_corpus(folder / "chapters.jsonl", tokenizer, folder / "prepared", progress=False)
    rng = np.random.default_rng(0)
    return [pair.input_ids for _ in range(2) for d in range(corpus.num_documents)
            for pair in make_sentence_pairs(corpus, d, rng)]


def mask_all(sequences, seed=0, **options):
    rng = np.random.default_rng(seed)
    return [mask_tokens(ids, rng, VOCAB, MASK, SPECIAL, **options) for ids in sequences]


def binomial_ok(count, n, p, sigmas=4.0):
    return abs(count / n - p) < sigmas * np.sqrt(p * (1 - p) / n)


def test_80_10_10_over_20k_predictions(sequences):
    outcomes = {"mask": 0, "random": 0, "kept": 0}
    for original, (masked, labels) in zip(sequences, mask_all(sequences)):
        chosen = labels != -100
        assert (labels[chosen] == original[chosen]).all()  # labels are the original ids
        outcomes["mask"] += int((masked[chosen] == MASK).sum())
        outcomes["kept"] += int((masked[chosen] == original[chosen]).sum())
        outcomes["random"] += int(((masked[chosen] != MASK) & (masked[chosen] != original[chosen])).sum())
        assert (masked[~chosen] == original[~chosen]).all() and (labels[~chosen] == -100).all()
    n = sum(outcomes.values())
    assert n > 20_000
    # A random draw equal to the original counts as kept: 0.1 / 30k, far inside the tolerance.
    for outcome, p in {"mask": 0.8, "random": 0.1, "kept": 0.1}.items():
        assert binomial_ok(outcomes[outcome], n, p), (outcome, outcomes[outcome] / n)


@pytest.mark.parametrize("cap", [20, 5])
def test_number_of_predictions_is_15_percent_of_candidates_capped(sequences, cap):
    chosen, candidates = 0, 0
    for original, (masked, labels) in zip(sequences, mask_all(sequences, max_predictions_per_seq=cap)):
        num_candidates = int(np.isin(original, SPECIAL, invert=True).sum())
        assert (labels != -100).sum() == min(cap, max(1, round(num_candidates * 0.15)))
        chosen, candidates = chosen + (labels != -100).sum(), candidates + num_candidates
    if cap == 20:  # 125 candidates at most here: the cap of 20 never binds
        assert abs(chosen / candidates - 0.15) < 0.005


def test_special_tokens_and_padding_are_never_masked(sequences):
    padded = [np.concatenate([ids, np.full(7, PAD)]) for ids in sequences[:300]]
    for original, (masked, labels) in zip(padded, mask_all(padded, mlm_probability=0.5, max_predictions_per_seq=200)):
        special = np.isin(original, SPECIAL)
        assert special.sum() >= 10
        assert (labels[special] == -100).all() and (masked[special] == original[special]).all()


def test_every_candidate_position_is_equally_likely():
    # Fixed-length sequences: each of the 126 candidate positions is chosen with p = 19/126.
    ids = np.concatenate([[CLS], np.arange(2000, 2060), [SEP], np.arange(3000, 3066), [SEP]])
    hits = np.zeros(len(ids))
    rng, trials = np.random.default_rng(1), 3000
    for _ in range(trials):
        hits += mask_tokens(ids, rng, VOCAB, MASK, SPECIAL)[1] != -100
    candidates = np.isin(ids, SPECIAL, invert=True)
    p = 19 / 126
    assert (hits[~candidates] == 0).all()
    assert np.abs(hits[candidates] / trials - p).max() < 4.5 * np.sqrt(p * (1 - p) / trials)


def test_random_replacements_avoid_special_ids():
    ids = np.concatenate([[CLS], np.arange(2000, 2100), [SEP]])
    rng, replaced = np.random.default_rng(2), []
    for _ in range(500):
        masked, labels = mask_tokens(ids, rng, 120, MASK, SPECIAL, mlm_probability=0.5, max_predictions_per_seq=50)
        chosen = labels != -100
        replaced += masked[chosen & (masked != MASK) & (masked != ids)].tolist()
    # A vocab of 120 ids: random ones avoid [PAD]/[CLS]/[SEP]/[MASK] and cover the rest.
    assert set(replaced) == set(range(120)) - {PAD, CLS, SEP, MASK}
    pool = np.array([7, 8])
    masked, labels = mask_tokens(ids, rng, VOCAB, MASK, SPECIAL, mlm_probability=1.0, max_predictions_per_seq=100,
                                 random_token_ids=pool)
    assert set(masked[(labels != -100) & (masked != MASK) & (masked != ids)].tolist()) <= {7, 8}


def test_whole_word_masking_never_splits_a_word(sequences, tokenizer):
    vocab = tokenizer.vocab
    is_continuation = np.zeros(VOCAB, dtype=bool)
    is_continuation[[i for token, i in vocab.items() if token.startswith("##")]] = True
    split_words, chosen, budget, multi_piece_words = 0, 0, 0, 0
    rng = np.random.default_rng(3)
    for original in sequences[:1200]:
        starts = ~is_continuation[original]
        masked, labels = mask_tokens(original, rng, VOCAB, MASK, SPECIAL, whole_word=True, word_starts=starts)
        # Words, numbered: a new one at each word-starting piece and after each special token.
        word_ids = np.cumsum(starts | np.concatenate([[True], np.isin(original[:-1], SPECIAL)]))
        candidate = np.isin(original, SPECIAL, invert=True)
        size = np.bincount(word_ids[candidate])
        hit = np.bincount(word_ids[candidate], weights=labels[candidate] != -100)
        split_words += int(((hit > 0) & (hit < size)).sum())
        multi_piece_words += int(((hit > 1) & (hit == size)).sum())
        target = min(20, max(1, round(candidate.sum() * 0.15)))
        assert (labels != -100).sum() <= target
        assert ((masked != original) <= (labels != -100)).all()
        chosen, budget = chosen + (labels != -100).sum(), budget + target
    assert split_words == 0
    assert multi_piece_words > 300  # words of several pieces were masked whole, so the check had teeth
    assert chosen > 0.97 * budget  # words that would overshoot are skipped, so a few short of the count


def test_whole_word_pieces_join_only_their_own_word():
    # "x ##y ##z" is one word; a "##" piece right after [SEP] starts a word of its own.
    ids = np.array([CLS, 2000, 2001, 2002, SEP, 2003, 2004])
    starts = np.array([True, True, False, False, True, False, True])
    rng, seen = np.random.default_rng(0), set()
    for _ in range(200):
        _, labels = mask_tokens(ids, rng, VOCAB, MASK, SPECIAL, mlm_probability=0.6, whole_word=True,
                                word_starts=starts)
        seen.add(tuple(np.flatnonzero(labels != -100).tolist()))
    # 5 candidates -> 3 predictions: the 3-piece word, or both 1-piece words (the big one no longer fits).
    assert seen == {(1, 2, 3), (5, 6)}


def test_same_seed_same_masks(sequences):
    first, second = mask_all(sequences[:50], seed=9), mask_all(sequences[:50], seed=9)
    assert all((a[0] == b[0]).all() and (a[1] == b[1]).all() for a, b in zip(first, second))
    third = mask_all(sequences[:50], seed=10)
    assert any((a[1] != c[1]).any() for a, c in zip(first, third))


def test_sequence_of_only_special_tokens_masks_nothing():
    masked, labels = mask_tokens([CLS, SEP, PAD], np.random.default_rng(0), VOCAB, MASK, SPECIAL)
    assert masked.tolist() == [CLS, SEP, PAD] and (labels == -100).all()


@pytest.mark.parametrize("options, message", [
    ({"mlm_probability": 0.0}, "mlm_probability must be greater than 0, got 0.0"),
    ({"mlm_probability": 1.5}, "mlm_probability must be at most 1, got 1.5"),
    ({"mlm_probability": "0.15"}, "mlm_probability must be a number, got '0.15'"),
    ({"max_predictions_per_seq": 0}, "max_predictions_per_seq must be at least 1, got 0"),
    ({"whole_word": True}, "whole_word=True needs word_starts"),
])
def test_bad_arguments(options, message):
    with pytest.raises(ValueError, match=message):
        mask_tokens([CLS, 2000, SEP], np.random.default_rng(0), VOCAB, MASK, SPECIAL, **options)
