"""The official SQuAD scoring (evaluate-v2.0.py's rules, for v1.1 files too): normalised exact match and token F1,
best over the gold answers."""
import collections
import logging
import re
import string

from .squad import QAExample

logger = logging.getLogger("bertforge")


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

    evaluate-v2.0.py's rules, on v1.1 and v2.0 files alike: gold answers that normalise to nothing are
    ignored, a question left without any (impossible) has the single gold answer "", and F1 is 1 when
    prediction and gold both normalise to nothing, else 0 when either does. On v1.1 data this equals
    evaluate-v1.1.py but for gold answers made only of articles and punctuation ("The", "?"): v1.1 keeps
    them, and an empty or article-only prediction matches one with EM 1, F1 0; here they are dropped, and
    such a prediction matches only a question left with no other gold, with EM 1, F1 1. Returns
    exact_match, f1 and total; with impossible questions also HasAns_exact, HasAns_f1, HasAns_total,
    NoAns_exact, NoAns_f1, NoAns_total (the subsets that are present). An example without a prediction
    scores 0, with a warning, as in evaluate-v1.1.py. Raises ValueError for no examples or a prediction
    that is not a str.
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
