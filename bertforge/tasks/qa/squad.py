"""SQuAD v1.1 / v2.0 extractive QA: read and write the JSON, cut contexts into windowed features,
turn start/end logits back into answer text, and score as the official scripts do.

The steps are google-research/bert's run_squad.py (windows a doc stride apart, the "max context"
rule, the n-best span search, v2's null-score threshold), but on character offsets from the
tokenizer instead of whitespace words: an answer is a slice of the context, so run_squad's
`_improve_answer_span` and `get_final_text` alignments are not needed.
"""
import collections
import json
import logging
import math
import os
import re
import string
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ...input_files import require_file

logger = logging.getLogger("bertforge")


# ---------------------------------------------------------------- examples

@dataclass
class Answer:
    """One gold answer: its text and the character index where it starts in the context."""
    text: str
    start: int

    @property
    def end(self) -> int:
        return self.start + len(self.text)


@dataclass
class QAExample:
    """One question about one context; `answers` is empty when `is_impossible` (SQuAD v2.0)."""
    id: str
    question: str
    context: str
    answers: list[Answer] = field(default_factory=list)
    is_impossible: bool = False
    title: str = ""


class SquadExamples(list):
    """The examples read from a file, as a list, with `problems`: one line per row skipped or doubted."""

    def __init__(self, examples=(), problems=()):
        super().__init__(examples)
        self.problems = list(problems)


def read_squad(path: str | os.PathLike, training: bool = True) -> SquadExamples:
    """Read an official SQuAD JSON file (data → paragraphs → qas) into examples, in file order.

    v1.1 and v2.0 files both read (is_impossible defaults to False). Rows that cannot be used are
    skipped with a warning, logged and listed on the result's `problems`: an empty question or
    context, a repeated id, an answerable question without answers. An answer whose text is not
    at its answer_start would teach the wrong span: with `training` it is dropped (and the example
    with it when no answer is left); with training=False answers are only gold texts for scoring,
    so it is reported and kept. Raises ValueError for a missing file, text that is not JSON, or a
    structure that is not SQuAD's (the message names the place, e.g. data[0].paragraphs[2]).
    """
    path = Path(path)
    require_file(path, "SQuAD file")
    try:
        root = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: not valid JSON ({error.msg}, line {error.lineno}); "
                         "a SQuAD file is one JSON object with a 'data' list") from None
    examples, seen_ids = SquadExamples(), set()

    def skip(where: str, message: str) -> None:
        examples.problems.append(f"{where}: {message}")
        logger.warning("%s: %s: %s", path, where, message)

    try:
        _read_examples(root, examples, seen_ids, skip, training)
    except ValueError as error:  # the structure is not SQuAD's: say which file
        raise ValueError(f"{path}: {error}") from None
    return examples


_REQUIRED = object()


def _read_examples(root, examples: SquadExamples, seen_ids: set, skip, training: bool) -> None:
    """Walk SQuAD's data -> paragraphs -> qas into `examples`; ValueError naming the place of a wrong structure."""
    for a, article in enumerate(_field(root, "data", list, "the file")):
        title = _field(article, "title", str, f"data[{a}]", default="")
        for p, paragraph in enumerate(_field(article, "paragraphs", list, f"data[{a}]")):
            where = f"data[{a}].paragraphs[{p}]"
            context = _field(paragraph, "context", str, where)
            for q, qa in enumerate(_field(paragraph, "qas", list, where)):
                row = f"{where}.qas[{q}]"
                qid = str(_field(qa, "id", (str, int), row))
                question = _field(qa, "question", str, row)
                impossible = _field(qa, "is_impossible", bool, row, default=False)
                answers = [Answer(_field(answer, "text", str, f"{row}.answers[{i}]"),
                                  _field(answer, "answer_start", int, f"{row}.answers[{i}]"))
                           for i, answer in enumerate(_field(qa, "answers", list, row, default=[]))]
                row = f"{row} (id {qid!r})"
                if not question.strip() or not context.strip():
                    skip(row, f"empty {'question' if not question.strip() else 'context'}; example skipped")
                    continue
                if qid in seen_ids:
                    skip(row, "id already used by an earlier question; example skipped")
                    continue
                if impossible and answers:
                    skip(row, "is_impossible but has answers; the answers are ignored")
                    answers = []
                misplaced = [answer for answer in answers if context[answer.start:answer.end] != answer.text
                             or not answer.text.strip() or answer.start < 0]
                for answer in misplaced:
                    found = context[max(answer.start, 0):answer.end]
                    skip(row, f"answer {answer.text!r} is not at answer_start {answer.start} (the context there "
                              f"reads {found!r}); " + ("answer dropped" if training else "kept as gold text only"))
                if training:
                    answers = [answer for answer in answers if answer not in misplaced]
                if not impossible and not answers:
                    if training:
                        skip(row, "no usable answer for an answerable question; example skipped")
                        continue
                    if not misplaced and "answers" in qa:
                        skip(row, "answerable question without answers; it can be predicted but not scored")
                seen_ids.add(qid)
                examples.append(QAExample(qid, question, context, answers, impossible, title))


def _field(record, key: str, kind, where: str, default=_REQUIRED):
    """record[key] checked to be of `kind` (bool is never an int); the default when absent and allowed."""
    if not isinstance(record, dict):
        raise ValueError(f"{where} is a JSON {type(record).__name__}, not an object; "
                         "a SQuAD file nests data → paragraphs → qas → answers, each a list of objects")
    if key not in record:
        if default is not _REQUIRED:
            return default
        raise ValueError(f"{where} has no {key!r} field (found {sorted(record)}); "
                         "is this a SQuAD file (data → paragraphs → context, qas)?")
    value = record[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        raise ValueError(f"{where}.{key} is a {type(value).__name__}, expected "
                         f"{' or '.join(k.__name__ for k in kinds)}; fix the file")
    return value


def write_squad(examples: list[QAExample], path: str | os.PathLike, version_2: bool = False) -> None:
    """Write examples as an official SQuAD JSON file: articles by title, paragraphs by context, in
    first-seen order. v2.0 adds is_impossible to every question. Raises ValueError when asked to
    write an impossible question as v1.1, which has no way to say so.
    """
    if not version_2 and any(example.is_impossible for example in examples):
        raise ValueError("SQuAD v1.1 has no impossible questions; pass version_2=True or leave them out")
    articles: dict[str, dict[str, list]] = {}
    for example in examples:
        qa = {"id": example.id, "question": example.question,
              "answers": [{"text": answer.text, "answer_start": answer.start} for answer in example.answers]}
        if version_2:
            qa["is_impossible"] = example.is_impossible
        articles.setdefault(example.title, {}).setdefault(example.context, []).append(qa)
    data = [{"title": title, "paragraphs": [{"context": context, "qas": qas} for context, qas in paragraphs.items()]}
            for title, paragraphs in articles.items()]
    document = {"version": "v2.0" if version_2 else "1.1", "data": data}
    Path(path).write_text(json.dumps(document, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")


# ---------------------------------------------------------------- features

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

    The question keeps its first max_query_length tokens; each distinct context is tokenized once
    and cut into windows of max_length - len(question) - 3 tokens whose starts are doc_stride
    apart (the last window ends at the context's end). With `training`, an answerable example's
    first answer is the target. Raises ValueError for max_length <= max_query_length + 3, a
    doc_stride < 1, or (training) an answerable example whose first answer is not at its start.
    """
    if max_query_length < 1 or max_length <= max_query_length + 3:
        raise ValueError(f"max_length ({max_length}) must exceed max_query_length ({max_query_length}) + 3 "
                         "([CLS] and two [SEP]), and max_query_length must be positive")
    if doc_stride < 1:
        raise ValueError(f"doc_stride must be a positive number of tokens, got {doc_stride}")
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
    if not indices:
        raise ValueError("cannot pad an empty batch; give at least one feature index")
    longest = max(len(features.input_ids[index]) for index in indices)
    batch = {"input_ids": torch.full((len(indices), longest), features.pad_token_id, dtype=torch.long),
             "token_type_ids": torch.zeros((len(indices), longest), dtype=torch.long),
             "attention_mask": torch.zeros((len(indices), longest), dtype=torch.long)}
    for row, index in enumerate(indices):
        size = len(features.input_ids[index])
        batch["input_ids"][row, :size] = torch.tensor(features.input_ids[index])
        batch["token_type_ids"][row, :size] = torch.tensor(features.token_type_ids[index])
        batch["attention_mask"][row, :size] = 1
    if features.start_positions is not None:
        batch["start_positions"] = torch.tensor([features.start_positions[index] for index in indices])
        batch["end_positions"] = torch.tensor([features.end_positions[index] for index in indices])
    return batch


# ---------------------------------------------------------------- predictions

def postprocess(examples: list[QAExample], features: QAFeatures, start_logits, end_logits, n_best_size: int = 20,
                max_answer_length: int = 30, version_2: bool = False, null_score_diff_threshold: float = 0.0,
                return_nbest: bool = False):
    """Predicted answer text per example id, from the logits of all its features (run_squad.py's search).

    start_logits / end_logits: (num_features, seq) tensor or array, or one sequence per feature,
    at least as long as the feature (padding positions are ignored). A span is kept when its
    start and end are context tokens among the feature's n_best_size highest logits, end >=
    start, it is at most max_answer_length tokens, and the feature is its start token's max
    context window; its score is start + end logit and its text the context's characters.
    v2: the null score is the lowest [CLS] start + end over the example's features, and "" is
    predicted when it beats the best span's score by more than null_score_diff_threshold.
    An example with no valid span predicts "". With return_nbest, returns (predictions, nbest):
    nbest maps each id to up to n_best_size dicts (text, probability, start_logit, end_logit),
    best first, probabilities a softmax over their scores. Raises ValueError for logits that do
    not match the features.
    """
    start_logits = _logit_rows(start_logits, features, "start_logits")
    end_logits = _logit_rows(end_logits, features, "end_logits")
    features_of = collections.defaultdict(list)
    for feature_index, example_index in enumerate(features.example_index):
        features_of[example_index].append(feature_index)

    predictions, nbest = {}, {}
    for example_index, example in enumerate(examples):
        candidates, null = [], None  # null: (score, start logit, end logit) of the lowest [CLS] pair
        for f in features_of[example_index]:
            starts, ends, offsets = start_logits[f], end_logits[f], features.offsets[f]
            if version_2 and (null is None or starts[0] + ends[0] < null[0]):
                null = (starts[0] + ends[0], starts[0], ends[0])
            for s in _best_indices(starts, n_best_size):
                if offsets[s] is None or not features.token_is_max_context[f][s]:
                    continue
                for e in _best_indices(ends, n_best_size):
                    if offsets[e] is None or e < s or e - s + 1 > max_answer_length:
                        continue
                    text = example.context[offsets[s][0]:offsets[e][1]]
                    candidates.append((starts[s] + ends[e], text, starts[s], ends[e]))
        if null is not None:
            candidates.append((null[0], "", null[1], null[2]))
        entries = _nbest_entries(candidates, n_best_size, null)
        best_span = next((entry for entry in entries if entry["text"]), None)
        if best_span is None:
            predictions[example.id] = ""
        elif version_2 and null[0] - (best_span["start_logit"] + best_span["end_logit"]) > null_score_diff_threshold:
            predictions[example.id] = ""
        else:
            predictions[example.id] = best_span["text"]
        nbest[example.id] = entries
    return (predictions, nbest) if return_nbest else predictions


def _logit_rows(logits, features: QAFeatures, name: str) -> list[np.ndarray]:
    """One float64 array per feature, cut to the feature's length. Raises ValueError on a mismatch."""
    if isinstance(logits, torch.Tensor):
        logits = logits.detach().float().cpu().numpy()
    if len(logits) != len(features):
        raise ValueError(f"{name} has {len(logits)} rows but there are {len(features)} features; "
                         "give one row per feature, in the order of qa_features")
    rows = []
    for row, input_ids in zip(logits, features.input_ids):
        row = np.asarray(row, dtype=np.float64)
        if row.ndim != 1 or len(row) < len(input_ids):
            raise ValueError(f"{name}: a row of shape {row.shape} is shorter than its feature "
                             f"({len(input_ids)} tokens); pass the logits for the whole sequence")
        rows.append(row[:len(input_ids)])
    return rows


def _best_indices(logits: np.ndarray, n: int) -> np.ndarray:
    return np.argsort(-logits, kind="stable")[:n]


def _nbest_entries(candidates: list[tuple], n_best_size: int, null: tuple | None) -> list[dict]:
    """The best distinct texts among (score, text, start logit, end logit), with softmax probabilities.

    v2 (a null is given) always lists "" even when it falls outside the n best, as run_squad.py does.
    """
    candidates.sort(key=lambda candidate: candidate[0], reverse=True)
    chosen, seen = [], set()
    for score, text, start_logit, end_logit in candidates:
        if len(chosen) == n_best_size:
            break
        if text not in seen:
            seen.add(text)
            chosen.append((score, text, start_logit, end_logit))
    if null is not None and "" not in seen:
        chosen.append(null[:1] + ("",) + null[1:])
    if not chosen:
        return []
    scores = np.array([score for score, *_ in chosen])
    probabilities = np.exp(scores - scores.max())
    probabilities /= probabilities.sum()
    return [{"text": text, "probability": float(probability), "start_logit": float(start_logit),
             "end_logit": float(end_logit)}
            for (_, text, start_logit, end_logit), probability in zip(chosen, probabilities)]


# ---------------------------------------------------------------- official scoring

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCTUATION = set(string.punctuation)


def normalize_answer(text: str) -> str:
    """The official normalisation: lower-case, drop ASCII punctuation, drop a/an/the, squeeze spaces."""
    text = "".join(char for char in text.lower() if char not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match_score(prediction: str, ground_truth: str) -> float:
    """1.0 when the two are equal after `normalize_answer`, else 0.0."""
    return float(normalize_answer(prediction) == normalize_answer(ground_truth))


def f1_score(prediction: str, ground_truth: str) -> float:
    """Token-level F1 of the normalised texts (a bag of words); v2.0's rule when one is empty:
    1.0 if both are (no answer predicted for no answer), else 0.0."""
    prediction_tokens, truth_tokens = normalize_answer(prediction).split(), normalize_answer(ground_truth).split()
    if not prediction_tokens or not truth_tokens:
        return float(prediction_tokens == truth_tokens)
    common = sum((collections.Counter(prediction_tokens) & collections.Counter(truth_tokens)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(prediction_tokens), common / len(truth_tokens)
    return 2 * precision * recall / (precision + recall)


def squad_evaluate(examples: list[QAExample], predictions: dict[str, str]) -> dict[str, float]:
    """Exact match and F1 in percent over all examples, the best over each one's gold answers.

    As evaluate-v2.0.py: gold answers that normalise to nothing are ignored, and a question
    without any (impossible) has the single gold answer "" (so predicting "" scores 1). This
    equals evaluate-v1.1.py on v1.1 data. Returns exact_match, f1 and total; with impossible
    questions also HasAns_exact, HasAns_f1, HasAns_total, NoAns_exact, NoAns_f1, NoAns_total
    (the subsets that are present). An example without a prediction scores 0, with a warning,
    as in evaluate-v1.1.py. Raises ValueError for no examples or a prediction that is not a str.
    """
    if not examples:
        raise ValueError("no examples to evaluate; pass the examples the predictions were made for")
    wrong = {qid: type(text).__name__ for qid, text in predictions.items() if not isinstance(text, str)}
    if wrong:
        raise ValueError(f"predictions must be answer strings; got {dict(list(wrong.items())[:3])}")
    missing = [example.id for example in examples if example.id not in predictions]
    if missing:
        logger.warning("%d of %d questions have no prediction (e.g. %r) and score 0",
                       len(missing), len(examples), missing[0])
    exact, f1, has_answer = [], [], []
    for example in examples:
        golds = [answer.text for answer in example.answers if normalize_answer(answer.text)] or [""]
        prediction = predictions.get(example.id)
        exact.append(0.0 if prediction is None else max(exact_match_score(prediction, gold) for gold in golds))
        f1.append(0.0 if prediction is None else max(f1_score(prediction, gold) for gold in golds))
        has_answer.append(golds != [""])
    results = _percentages(exact, f1, "")
    if not all(has_answer):
        for prefix, wanted in (("HasAns_", True), ("NoAns_", False)):
            subset = [i for i, has in enumerate(has_answer) if has == wanted]
            if subset:
                results.update(_percentages([exact[i] for i in subset], [f1[i] for i in subset], prefix))
    return results


def _percentages(exact: list[float], f1: list[float], prefix: str) -> dict[str, float]:
    exact_key = f"{prefix}exact" if prefix else "exact_match"
    return {exact_key: 100.0 * sum(exact) / len(exact), f"{prefix}f1": 100.0 * sum(f1) / len(f1),
            f"{prefix}total": len(exact)}
