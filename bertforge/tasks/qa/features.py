"""QA features: a question and a window of its context as one row of ids, run_squad.py's doc-stride windows
and "max context" rule, and the batch collation."""
import logging
import math
from dataclasses import dataclass

import torch

from ...train.collate import pad_rows
from ...validation import Bound, checked
from .squad import QAExample

logger = logging.getLogger("bertforge")


@dataclass
class QAFeatures:
    """Model inputs, one entry per feature (a window of one example's context); lists are unpadded.

    A feature is [CLS] question [SEP] window [SEP] with token types 0 then 1. `offsets[f][i]` is
    the (start, end) character span of token i in the example's context when it is a context
    token, else None. `token_is_max_context[f][i]` is True where feature f is the window that
    gives context token i the most context on its shorter side (run_squad.py's rule), so each
    context token has exactly one such window and an answer is taken from there only.
    start_positions / end_positions (training only) index the answer's first and last token, or
    0 ([CLS]) when the answer is not wholly inside the window or the question has none.
    """
    input_ids: list[list[int]]
    token_type_ids: list[list[int]]
    attention_mask: list[list[int]]
    example_index: list[int]
    offsets: list[list[tuple[int, int] | None]]
    token_is_max_context: list[list[bool]]
    start_positions: list[int] | None = None
    end_positions: list[int] | None = None
    pad_token_id: int = 0

    def __len__(self) -> int:
        return len(self.input_ids)

    def pad_batch(self, indices) -> dict[str, torch.Tensor]:
        """The features at `indices` as padded (batch, seq) tensors; see the module's `pad_batch`."""
        return pad_batch(self, indices)


def qa_features(tokenizer, examples: list[QAExample], max_length: int = 384, doc_stride: int = 128,
                max_query_length: int = 64, training: bool = True) -> QAFeatures:
    """Tokenize examples into windowed features (see `QAFeatures`); defaults are run_squad.py's flags.

    The question keeps its first max_query_length tokens (one warning counts the questions cut); each
    distinct context is tokenized once and cut into windows of max_length - len(question) - 3 tokens
    whose starts are doc_stride apart (the last window ends at the context's end). With `training`, an
    answerable example's first answer is the target. Raises ValueError for max_length <= max_query_length
    + 3, a doc_stride < 1, or (training) an answerable example whose first answer is not at its start.
    """
    checked("max_query_length", max_query_length)
    room = Bound(max_query_length + 4, meaning=f"max_query_length {max_query_length}, [CLS], two [SEP] and a token "
                                                "of context")
    checked("max_length", max_length, bound=room)
    checked("doc_stride", doc_stride)
    if training:
        _check_training_answers(examples)
    features = QAFeatures([], [], [], [], [], [], [] if training else None, [] if training else None,
                          pad_token_id=tokenizer.pad_token_id)
    if not examples:
        return features
    questions = tokenizer([example.question for example in examples], add_special_tokens=False)["input_ids"]
    contexts = list(dict.fromkeys(example.context for example in examples))
    encoded = tokenizer(contexts, add_special_tokens=False, return_offsets_mapping=True)
    tokenized = dict(zip(contexts, zip(encoded["input_ids"], encoded["offset_mapping"])))
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    _warn_long_questions(questions, max_query_length)

    for example_index, (example, question) in enumerate(zip(examples, questions)):
        question = question[:max_query_length]
        context_ids, context_offsets = tokenized[example.context]
        windows = context_windows(len(context_ids), max_length - len(question) - 3, doc_stride)
        best_window = max_context_windows(windows, len(context_ids))
        answer_span = None
        if training and not example.is_impossible:
            answer = example.answers[0]
            answer_span = answer_token_span(context_offsets, answer.start, answer.end)
            if answer_span is None:  # the answer is only characters the tokenizer drops
                logger.warning("example %r: no token covers answer %r; example left out of training",
                               example.id, answer.text)
                continue
        question_length = len(question) + 2  # [CLS] question [SEP]: where the window begins
        for window_index, (start, length) in enumerate(windows):
            end = start + length
            features.input_ids.append([cls, *question, sep, *context_ids[start:end], sep])
            features.token_type_ids.append([0] * question_length + [1] * (length + 1))
            features.attention_mask.append([1] * (question_length + length + 1))
            features.example_index.append(example_index)
            features.offsets.append([None] * question_length + [tuple(o) for o in context_offsets[start:end]] + [None])
            features.token_is_max_context.append(
                [False] * question_length + [best_window[i] == window_index for i in range(start, end)] + [False])
            if training:
                inside = answer_span is not None and start <= answer_span[0] and answer_span[1] < end
                shift = question_length - start
                features.start_positions.append(answer_span[0] + shift if inside else 0)
                features.end_positions.append(answer_span[1] + shift if inside else 0)
    return features


def _warn_long_questions(questions: list[list[int]], max_query_length: int) -> None:
    """One warning line per call: the answers to these questions come from their first tokens only."""
    cut = sum(len(question) > max_query_length for question in questions)
    if cut:
        logger.warning("%d of %d questions were cut to their first %d tokens (max_query_length); the rest of each "
                       "was not read", cut, len(questions), max_query_length)


def _check_training_answers(examples: list[QAExample]) -> None:
    for example in examples:
        if example.is_impossible:
            continue
        if not example.answers:
            raise ValueError(f"example {example.id!r} is answerable but has no answers; give one, mark it "
                             "is_impossible, or pass training=False")
        answer = example.answers[0]
        if example.context[answer.start:answer.end] != answer.text or answer.start < 0:
            raise ValueError(f"example {example.id!r}: answer {answer.text!r} is not at character {answer.start} "
                             "of its context; fix the start (read_squad drops such answers for you)")


def context_windows(num_tokens: int, window_length: int, doc_stride: int) -> list[tuple[int, int]]:
    """(start, length) of each window over num_tokens context tokens, as run_squad.py cuts them.

    Starts step by doc_stride (by the window length when that is smaller, so no token is ever
    skipped); the last window stops at the last token. No tokens, no windows.
    """
    windows, start = [], 0
    while start < num_tokens:
        length = min(window_length, num_tokens - start)
        windows.append((start, length))
        if start + length == num_tokens:
            break
        start += min(length, doc_stride)
    return windows


def max_context_windows(windows: list[tuple[int, int]], num_tokens: int) -> list[int]:
    """Per context token, the index of the window where it has the most context (run_squad.py).

    A token's score in a window is min(tokens left of it, tokens right of it) + 0.01 * window
    length; the first of equal scores wins, as in `_check_is_max_context`.
    """
    best_window, best_score = [0] * num_tokens, [-math.inf] * num_tokens
    for window_index, (start, length) in enumerate(windows):
        for position in range(start, start + length):
            score = min(position - start, start + length - 1 - position) + 0.01 * length
            if score > best_score[position]:
                best_window[position], best_score[position] = window_index, score
    return best_window


def answer_token_span(offsets: list[tuple[int, int]], char_start: int, char_end: int) -> tuple[int, int] | None:
    """First and last token overlapping the characters [char_start, char_end); None when none does.

    A token only partly inside the answer is taken whole ("Japan" in "Japanese" gives "japanese"),
    which is what run_squad.py ends with after `_improve_answer_span` finds no better match.
    """
    overlapping = [i for i, (start, end) in enumerate(offsets) if start < char_end and end > char_start]
    return (overlapping[0], overlapping[-1]) if overlapping else None


def pad_batch(features: QAFeatures, indices) -> dict[str, torch.Tensor]:
    """The features at `indices` as (batch, longest) int64 tensors, padded on the right.

    Returns input_ids ([PAD] padding), token_type_ids, attention_mask (1 = real token) and, for
    training features, start_positions and end_positions (batch,). Raises ValueError for no indices.
    """
    indices = [int(index) for index in indices]
    rows = {name: [getattr(features, name)[index] for index in indices] for name in ("input_ids", "token_type_ids")}
    answers = None
    if features.start_positions is not None:
        answers = {name: [getattr(features, name)[index] for index in indices]
                   for name in ("start_positions", "end_positions")}
    return pad_rows(rows, features.pad_token_id, row_fields=answers)
