"""What a classifier's logits are shown as, through every door: transformers' text-classification pipeline's rule.

A one-label model saved without problem_type (how transformers and sentence-transformers save a cross-encoder)
was shown raw by `predict`, `/classify`, `/predict` and `search --rerank` while transformers' pipeline,
CrossEncoder.predict and `/rerank` gave its sigmoid; a model whose config says regression stays raw everywhere.
"""
import json

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient
from transformers import BertConfig, BertForSequenceClassification, BertTokenizer

from bertforge.cli import main
from bertforge.search.rerank import Reranker
from bertforge.serve.app import create_app
from bertforge.serve.models import load_models
from bertforge.tasks.classification.labels import output_function

TEXTS = ["I loved this film.", "The pills gave me a headache."]
QUERY = "does it cause headaches"


def one_label_model(folder, vocab_from, problem_type=None):
    torch.manual_seed(0)
    config = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                        intermediate_size=37, num_labels=1, problem_type=problem_type)
    BertForSequenceClassification(config).save_pretrained(folder)  # transformers' own files: no problem_type
    BertTokenizer.from_pretrained(vocab_from).save_pretrained(folder)
    return folder


def logits_of(folder, texts, pair_with=None):
    model, tokenizer = BertForSequenceClassification.from_pretrained(folder), BertTokenizer.from_pretrained(folder)
    inputs = tokenizer([pair_with] * len(texts), texts, padding=True, return_tensors="pt") if pair_with else \
        tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        return model(**inputs).logits[:, 0].numpy()


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


def test_the_rule_is_the_pipelines():
    assert output_function(None, 1) == "sigmoid" and output_function("regression", 1) == "none"
    assert output_function(None, 3) == "softmax" and output_function("single_label_classification", 2) == "softmax"
    assert output_function("multi_label_classification", 3) == "sigmoid"


@pytest.mark.parametrize("problem_type", [None, "regression"])
def test_a_one_label_model_is_shown_alike_by_predict_the_server_and_the_reranker(problem_type, minilm_dir, tmp_path):
    folder = one_label_model(tmp_path / "model", minilm_dir, problem_type)
    shown = sigmoid if problem_type is None else (lambda x: x)
    expected = shown(logits_of(folder, TEXTS))
    if problem_type is None:  # what transformers' pipeline gives
        from transformers import pipeline
        scores = [row["score"] for row in pipeline("text-classification", model=str(folder), device="cpu")(TEXTS)]
        np.testing.assert_allclose(scores, expected, atol=1e-5)

    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"text": text}) + "\n" for text in TEXTS), encoding="utf-8")
    assert main(["predict", "--model", str(folder), "--input", str(tmp_path / "in.jsonl"),
                 "--output", str(tmp_path / "out.jsonl")]) == 0
    predicted = [json.loads(line)["prediction"] for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    np.testing.assert_allclose(predicted, expected, atol=1e-5)

    with TestClient(create_app(load_models(str(minilm_dir), classifier=str(folder), device="cpu"))) as client:
        served = [row[0]["score"] for row in client.post("/classify", json={"inputs": TEXTS}).json()]
        np.testing.assert_allclose(served, expected, atol=1e-5)
        predicted = [row[0]["score"] for row in client.post("/predict", json={"inputs": [[t] for t in TEXTS]}).json()]
        np.testing.assert_allclose(predicted, expected, atol=1e-5)
        raw = [row[0]["score"] for row in client.post("/predict", json={"inputs": [[t] for t in TEXTS],
                                                                          "raw_scores": True}).json()]
        np.testing.assert_allclose(raw, logits_of(folder, TEXTS), atol=1e-5)

    reranked = Reranker(folder).scores(QUERY, TEXTS)  # `search --rerank`: a one-label folder is read as a pair
    np.testing.assert_allclose(reranked, shown(logits_of(folder, TEXTS, pair_with=QUERY)), atol=1e-5)


def test_a_classifier_saved_with_transformers_default_labels_is_read_as_label_0_and_label_1(minilm_dir, tmp_path):
    """transformers 5 writes no id2label for its default two labels: predict and serve refused the folder as "not
    fine-tuned for classification" while transformers' pipeline answers LABEL_0 / LABEL_1."""
    from transformers import pipeline

    torch.manual_seed(0)
    config = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                        intermediate_size=37)
    BertForSequenceClassification(config).save_pretrained(tmp_path / "model")
    BertTokenizer.from_pretrained(minilm_dir).save_pretrained(tmp_path / "model")
    assert "id2label" not in json.loads((tmp_path / "model" / "config.json").read_text())
    expected = {row["label"]: row["score"] for row in
                pipeline("text-classification", model=str(tmp_path / "model"), device="cpu", top_k=None)([TEXTS[0]])[0]}
    (tmp_path / "in.jsonl").write_text(json.dumps({"text": TEXTS[0]}) + "\n", encoding="utf-8")
    assert main(["predict", "--model", str(tmp_path / "model"), "--input", str(tmp_path / "in.jsonl"),
                 "--output", str(tmp_path / "out.jsonl")]) == 0
    row = json.loads((tmp_path / "out.jsonl").read_text())
    assert row["p_LABEL_0"] == pytest.approx(expected["LABEL_0"], abs=1e-5)
    assert row["p_LABEL_1"] == pytest.approx(expected["LABEL_1"], abs=1e-5)
    assert main(["predict", "--model", str(minilm_dir), "--input", str(tmp_path / "in.jsonl"),  # a plain encoder
                 "--output", str(tmp_path / "refused.jsonl")]) == 1


@pytest.mark.parametrize("combine", ["clinical", "max"])
def test_a_long_text_is_read_in_windows_alike_by_predict_and_the_server(combine, minilm_dir, tmp_path):
    """`predict` reads a text longer than the classifier's length in windows and combines them (data.combine); the
    server's /classify and /predict refused it (413) or cut it. Now all three give the same scores; a request that
    asks to cut gets the first window's, as TEI cuts; a pair is still read as one window."""
    from bertforge.tasks.finetune import TASK_FILE

    torch.manual_seed(0)
    config = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                        intermediate_size=37, id2label={0: "no", 1: "yes"}, problem_type="single_label_classification")
    folder, model, tokenizer = tmp_path / "model", BertForSequenceClassification(config).eval(), \
        BertTokenizer.from_pretrained(minilm_dir)
    halves = ["the pills gave me a headache " * 4, "I loved this film, a wonderful story " * 4]
    with torch.no_grad():  # random weights score every text alike: a head pointing from one half to the other
        pooled = model.bert(**tokenizer(halves, padding=True, return_tensors="pt")).pooler_output
        direction = pooled[1] - pooled[0]
        model.classifier.weight.copy_(torch.stack([-direction, direction]) * 2 / direction.square().sum())
        model.classifier.bias.copy_(-model.classifier.weight @ pooled.mean(0))  # 0 halfway between the halves
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    (folder / TASK_FILE).write_text(json.dumps({"task": "classification", "init_from": "minilm",
                                                "data": {"max_length": 32, "combine": combine}}), encoding="utf-8")
    long_text = " ".join(halves)
    texts = [long_text, TEXTS[0]]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"text": text}) + "\n" for text in texts), encoding="utf-8")
    assert main(["predict", "--model", str(folder), "--input", str(tmp_path / "in.jsonl"),
                 "--output", str(tmp_path / "out.jsonl")]) == 0
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    expected = np.array([[row["p_no"], row["p_yes"]] for row in rows])
    first_window = BertTokenizer.from_pretrained(folder)(long_text, truncation=True, max_length=32, return_tensors="pt")
    with torch.no_grad():
        cut = BertForSequenceClassification.from_pretrained(folder)(**first_window).logits.softmax(-1)[0].numpy()
    assert np.abs(expected[0] - cut).max() > 1e-3  # the windows' combination is not the first window's

    def by_label(answer):
        scores = {p["label"]: p["score"] for p in answer}
        return [scores["no"], scores["yes"]]

    with TestClient(create_app(load_models(str(minilm_dir), classifier=str(folder), device="cpu"))) as client:
        classified = client.post("/classify", json={"inputs": texts}).json()
        np.testing.assert_allclose([by_label(answer) for answer in classified], expected, atol=1e-5)
        predicted = client.post("/predict", json={"inputs": [[long_text], [TEXTS[0], TEXTS[1]]]}).json()
        np.testing.assert_allclose(by_label(predicted[0]), expected[0], atol=1e-5)
        pair = BertTokenizer.from_pretrained(folder)(TEXTS[0], TEXTS[1], return_tensors="pt")
        with torch.no_grad():
            pair_scores = BertForSequenceClassification.from_pretrained(folder)(**pair).logits.softmax(-1)[0].numpy()
        np.testing.assert_allclose(by_label(predicted[1]), pair_scores, atol=1e-5)
        truncated = client.post("/classify", json={"inputs": long_text, "truncate": True}).json()
        np.testing.assert_allclose(by_label(truncated), cut, atol=1e-5)


@pytest.mark.parametrize("head", ["ner", "qa"])
def test_a_checkpoint_of_few_positions_from_elsewhere_is_read_within_them(head, minilm_dir, tmp_path, capsys):
    """NER and QA folders without task.json were read at the standard 128 / 384 tokens: a model of 64 positions
    (a tiny or distilled one, saved by transformers) refused every input, and predict has no option to shorten."""
    import bertforge
    from bertforge.tasks.finetune import prediction_task

    folder = tmp_path / head
    tokenizer = bertforge.BertTokenizer.from_pretrained(minilm_dir)
    shape = dict(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                 intermediate_size=37, max_position_embeddings=64)
    if head == "ner":
        config = bertforge.BertConfig(**shape, id2label={0: "O", 1: "B-X", 2: "I-X"})
        bertforge.BertForTokenClassification(config).save_pretrained(folder, tokenizer=tokenizer)
        source, output = tmp_path / "in.conll", tmp_path / "out.conll"
        source.write_text("\n".join(["the quick brown fox jumps over the lazy dog"] * 20).replace(" ", "\n") + "\n")
    else:
        bertforge.BertForQuestionAnswering(bertforge.BertConfig(**shape)).save_pretrained(folder, tokenizer=tokenizer)
        source, output = tmp_path / "in.json", tmp_path / "out.json"
        context = "the quick brown fox jumps over the lazy dog " * 30 + "Paris is the capital."
        answer = {"text": "Paris", "answer_start": context.index("Paris")}
        question = {"id": "q1", "question": "What is the capital?", "answers": [answer]}
        paragraph = {"context": context, "qas": [question]}
        source.write_text(json.dumps({"data": [{"title": "t", "paragraphs": [paragraph]}]}))
    task, _ = prediction_task(folder)
    assert task.settings.max_length == 64
    if head == "ner":  # a table read as CoNLL tagged each of its lines as one word ("text,label" a word), exit 0
        table = tmp_path / "rows.csv"
        table.write_text("text\nthe quick brown fox\n")
        assert main(["predict", "--model", str(folder), "--input", str(table), "--output", str(output)]) == 1
        assert "it is named as a table (.csv)" in capsys.readouterr().err and not output.exists()
    assert main(["predict", "--model", str(folder), "--input", str(source), "--output", str(output)]) == 0
    assert output.exists() and "error" not in capsys.readouterr().err
    if head == "qa":  # SQuAD's {id: answer} object was written into a .jsonl file, which JSON Lines readers refuse
        lines = tmp_path / "a.jsonl"
        assert main(["predict", "--model", str(folder), "--input", str(source), "--output", str(lines)]) == 2
        assert "use a .json file name" in capsys.readouterr().err and not lines.exists()
