"""Answers from start/end logits: the n-best span search over every window of a context, and SQuAD 2.0's
null-score threshold."""
import collections

import numpy as np
import torch

from .features import QAFeatures
from .squad import QAExample


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
