"""One document probability from the same window probabilities, whichever way a two-class model is scored:
`finetune` evaluation and `bertforge predict` (ClassificationTask) and readmission (admission_scores)."""
import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from bertforge import BertTokenizer
from bertforge.models.config import BertConfig
from bertforge.readmission.baselines import admission_scores
from bertforge.tasks import TaskSettings
from bertforge.tasks.classification.task import ClassificationTask
from bertforge.tasks.classification.windows import encode_windows

WORDS = "one two three four five six seven eight nine".split()  # one word piece each


class FirstPieceClassifier(torch.nn.Module):
    """A two-class classifier whose P(class 1) for a window is set by the window's first word piece."""

    def __init__(self, p_one: dict[int, float], default: float = 0.5):
        super().__init__()
        self.p_one, self.default = p_one, default

    def forward(self, input_ids, token_type_ids=None, attention_mask=None):
        p_one = torch.tensor([self.p_one.get(int(i), self.default) for i in input_ids[:, 1]], dtype=torch.float64)
        return SimpleNamespace(logits=torch.stack([1 - p_one, p_one], dim=1).log().float())


@pytest.fixture(scope="module")
def tokenizer(minilm_dir):
    return BertTokenizer.from_pretrained(minilm_dir)


@pytest.fixture(scope="module")
def model(tokenizer):
    # Windows of 3 pieces start at "one", "four" and "seven": P(class 1) 0.9, 0.2 and 0.1.
    first = tokenizer.convert_tokens_to_ids(["one", "four", "seven"])
    return FirstPieceClassifier(dict(zip(first, [0.9, 0.2, 0.1])))


def two_class_task(tokenizer, method: str) -> ClassificationTask:
    config = BertConfig(id2label={0: "neg", 1: "pos"}, problem_type="single_label_classification")
    return ClassificationTask(TaskSettings(max_length=5, stride=0, combine=method), tokenizer, config)


@pytest.mark.parametrize("method, p_one", [("clinical", 0.6), ("max", 0.9), ("mean", 0.4)])
def test_finetune_predict_and_readmission_agree_on_a_document(tokenizer, model, tmp_path, method, p_one):
    """finetune/predict combined both softmax columns and renormalised: 0.4545 (label neg) for ClinicalBERT's
    0.6, which readmission gave; "max" printed p_neg 0.9, p_pos 0.9 and picked neg."""
    task = two_class_task(tokenizer, method)
    windows = encode_windows(tokenizer, [(" ".join(WORDS),)], task.max_length, task.stride)
    assert windows.document_index == [0, 0, 0]
    scores = task.document_scores(model, windows, 8, torch.device("cpu"))  # what finetune's evaluate scores
    np.testing.assert_allclose(scores, [[1 - p_one, p_one]], atol=1e-6)
    if method == "clinical":
        _, readmission = admission_scores([7, 7, 7], [0.9, 0.2, 0.1])
        np.testing.assert_allclose(readmission, [p_one])
    data = tmp_path / "docs.csv"
    data.write_text("text\n" + " ".join(WORDS) + "\n", encoding="utf-8")
    assert task.predict_file(model, str(data), str(tmp_path / "out.jsonl"), batch_size=8) == 1
    [record] = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert record["p_pos"] == pytest.approx(p_one, abs=1e-6) and record["p_neg"] == pytest.approx(1 - p_one, abs=1e-6)
    assert record["prediction"] == ("pos" if p_one > 0.5 else "neg")
