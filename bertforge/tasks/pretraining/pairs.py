"""Sentence pairs for NSP (google-research/bert's create_instances_from_document), and MLM-only packing.

Work happens in two steps: `plan_sentence_pairs` decides everything from sentence lengths alone
(which sentences form A and B, how many tokens truncation cuts from each end), and `build_pair`
slices the token ids. Planning reads no token ids, so a dataset can count an epoch's instances
for every rank cheaply; building is two slices and a concatenation.
"""
from dataclasses import dataclass

import numpy as np

from ...validation import checked



@dataclass(frozen=True)
class Segment:
    """Sentences [start, end) of document `document`, less `trim_front`/`trim_back` tokens cut by truncation."""
    document: int
    start: int
    end: int
    trim_front: int = 0
    trim_back: int = 0


@dataclass(frozen=True)
class PairPlan:
    """One instance before its tokens are read: segment A, segment B (None for MLM-only) and the NSP label."""
    a: Segment
    b: Segment | None
    is_random_next: bool | None


@dataclass
class SentencePair:
    """A built instance: `[CLS] A [SEP] B [SEP]` (or `[CLS] X [SEP]`), before masking.

    input_ids, token_type_ids: (seq,) int64; token types are 0 for [CLS] A [SEP], 1 for B [SEP].
    next_sentence_label: 0 = B continues A (IsNext), 1 = B is from another document (NotNext),
    as in transformers; None for MLM-only instances. plan says where the tokens came from.
    """
    input_ids: np.ndarray
    token_type_ids: np.ndarray
    next_sentence_label: int | None
    plan: PairPlan


def check_pair_args(max_seq_length: int, short_seq_prob: float) -> None:
    """Raise UsageError (a ValueError) for a max_seq_length or short_seq_prob that cannot make instances."""
    checked("max_seq_length", max_seq_length)
    checked("short_seq_prob", short_seq_prob, float)


def make_sentence_pairs(corpus, document_index: int, rng: np.random.Generator, max_seq_length: int = 128,
                        short_seq_prob: float = 0.1, nsp: bool = True) -> list[SentencePair]:
    """The instances of one document, as create_instances_from_document makes them (nsp=True).

    nsp=False packs whole sentences into `[CLS] X [SEP]` instead (see `plan_sentence_pairs`).
    Raises ValueError for max_seq_length < 5, a bad short_seq_prob, or nsp with one document.
    """
    plans = plan_sentence_pairs(corpus, document_index, rng, max_seq_length, short_seq_prob, nsp)
    return [build_pair(corpus, plan) for plan in plans]


def plan_sentence_pairs(corpus, document_index: int, rng: np.random.Generator, max_seq_length: int = 128,
                        short_seq_prob: float = 0.1, nsp: bool = True) -> list[PairPlan]:
    """Plans for the instances of one document; `corpus` needs num_documents and sentence_lengths(i).

    nsp=True follows create_instances_from_document step by step (comments quote its reasons).
    nsp=False is RoBERTa's packing within a document (DOC-SENTENCES): contiguous whole sentences
    up to max_seq_length - 2 tokens, a sentence longer than that alone and truncated.
    """
    check_pair_args(max_seq_length, short_seq_prob)
    if nsp and corpus.num_documents < 2:
        raise ValueError("next sentence prediction needs at least 2 documents (B is sometimes taken from "
                         "another one); add documents or use nsp=False")
    lengths = corpus.sentence_lengths(document_index)
    if not nsp:
        return _plan_packed(document_index, lengths, rng, max_seq_length - 2, short_seq_prob)
    return _plan_pairs(corpus, document_index, lengths, rng, max_seq_length - 3, short_seq_prob)


def _target_length(rng: np.random.Generator, max_num_tokens: int, short_seq_prob: float) -> int:
    # Usually fill the whole sequence (it is padded to max_seq_length anyway); sometimes go
    # shorter to lessen the mismatch with short fine-tuning inputs. Drawn once per document,
    # as in the original.
    if rng.random() < short_seq_prob:
        return int(rng.integers(2, max_num_tokens + 1))  # randint(2, max_num_tokens), both ends included
    return max_num_tokens


def _plan_pairs(corpus, document_index: int, lengths: np.ndarray, rng: np.random.Generator,
                max_num_tokens: int, short_seq_prob: float) -> list[PairPlan]:
    target_seq_length = _target_length(rng, max_num_tokens, short_seq_prob)
    ends = np.concatenate([[0], np.cumsum(lengths)]).tolist()  # ends[j] - ends[i]: tokens of sentences [i, j)
    # Segments A and B end at real sentence boundaries (not an arbitrary split of the
    # concatenated text), which would make next sentence prediction too easy.
    plans = []
    chunk_start, i, num_sentences = 0, 0, len(lengths)
    while i < num_sentences:
        if i == num_sentences - 1 or ends[i + 1] - ends[chunk_start] >= target_seq_length:
            chunk_size = i + 1 - chunk_start
            a_end = 1 if chunk_size == 1 else int(rng.integers(1, chunk_size))  # randint(1, chunk_size - 1)
            length_a = ends[chunk_start + a_end] - ends[chunk_start]
            if chunk_size == 1 or rng.random() < 0.5:
                is_random_next = True
                b_document = _other_document(corpus.num_documents, document_index, rng)
                b_start, b_end, length_b = _span_from(corpus.sentence_lengths(b_document), rng,
                                                      target_seq_length - length_a)
                # The chunk's sentences after A were not used: "put them back" so they start the next chunk.
                i -= chunk_size - a_end
            else:
                is_random_next = False
                b_document, b_start, b_end = document_index, chunk_start + a_end, chunk_start + chunk_size
                length_b = ends[b_end] - ends[b_start]
            (a_front, a_back), (b_front, b_back) = truncation(length_a, length_b, max_num_tokens, rng)
            plans.append(PairPlan(Segment(document_index, chunk_start, chunk_start + a_end, a_front, a_back),
                                  Segment(b_document, b_start, b_end, b_front, b_back), is_random_next))
            chunk_start = i + 1
        i += 1
    return plans


def _other_document(num_documents: int, document_index: int, rng: np.random.Generator) -> int:
    # The original retries randint(0, n - 1) up to 10 times to avoid document_index and then
    # keeps whatever it drew; drawing from the other n - 1 directly is the same uniform choice
    # without the rare fallback to the same document (1 in 1024 with two documents).
    other = int(rng.integers(num_documents - 1))
    return other + (other >= document_index)


def _span_from(lengths: np.ndarray, rng: np.random.Generator, target_length: int) -> tuple[int, int, int]:
    """(start, end, tokens): from a random sentence, whole sentences until target_length is reached."""
    start = int(rng.integers(len(lengths)))
    ends = np.cumsum(lengths[start:])
    taken = min(int(np.searchsorted(ends, target_length)), len(ends) - 1) + 1  # first sum >= target, or all
    return start, start + taken, int(ends[taken - 1])


def truncation(length_a: int, length_b: int, max_num_tokens: int,
               rng: np.random.Generator) -> tuple[tuple[int, int], tuple[int, int]]:
    """((A front, A back), (B front, B back)): tokens that truncate_seq_pair cuts from each end.

    The original removes one token at a time from the longer side (B on a tie), from the front
    or the back with probability 1/2 each. Which side loses each token depends on lengths only,
    so the counts are computed directly and the front/back split of each side is a binomial
    draw: the same distribution without a loop over tokens.
    """
    excess = length_a + length_b - max_num_tokens
    if excess <= 0:
        return (0, 0), (0, 0)
    # First the longer side alone until both are equal, then alternately, starting with B.
    from_longer = min(excess, abs(length_a - length_b))
    rest = excess - from_longer
    cut_a = (from_longer if length_a > length_b else 0) + rest // 2
    cut_b = (from_longer if length_a <= length_b else 0) + rest - rest // 2
    a_front = int(rng.binomial(cut_a, 0.5))
    b_front = int(rng.binomial(cut_b, 0.5))
    return (a_front, cut_a - a_front), (b_front, cut_b - b_front)


def _plan_packed(document_index: int, lengths: np.ndarray, rng: np.random.Generator, capacity: int,
                 short_seq_prob: float) -> list[PairPlan]:
    target_length = _target_length(rng, capacity, short_seq_prob)
    ends = np.concatenate([[0], np.cumsum(lengths)])  # ends[j] - ends[i]: tokens of sentences [i, j)
    plans, start = [], 0
    while start < len(lengths):
        # Whole sentences while they fit the target; always at least one.
        fitting = int(np.searchsorted(ends, ends[start] + target_length, side="right")) - 1
        end = max(start + 1, fitting)
        length = int(ends[end] - ends[start])
        # One sentence longer than a sequence (a text without full stops) is read in consecutive windows, as
        # transformers' group_texts reads a stream: cut at both ends to one window, the rest was never trained on
        for window_start in range(0, max(length, 1), capacity):
            window_end = min(window_start + capacity, length)
            plans.append(PairPlan(Segment(document_index, start, end, window_start, length - window_end), None, None))
        start = end
    return plans


def build_pair(corpus, plan: PairPlan) -> SentencePair:
    """Read the tokens of a plan from `corpus` and lay them out with [CLS]/[SEP] and token types."""
    cls, sep = np.array([corpus.cls_token_id]), np.array([corpus.sep_token_id])
    tokens_a = _segment_tokens(corpus, plan.a)
    if plan.b is None:
        input_ids = np.concatenate([cls, tokens_a, sep])
        return SentencePair(input_ids, np.zeros_like(input_ids), None, plan)
    tokens_b = _segment_tokens(corpus, plan.b)
    input_ids = np.concatenate([cls, tokens_a, sep, tokens_b, sep])
    token_type_ids = np.zeros_like(input_ids)
    token_type_ids[len(tokens_a) + 2:] = 1
    return SentencePair(input_ids, token_type_ids, int(plan.is_random_next), plan)


def _segment_tokens(corpus, segment: Segment) -> np.ndarray:
    tokens = corpus.tokens(segment.document, segment.start, segment.end)
    return tokens[segment.trim_front:len(tokens) - segment.trim_back]
