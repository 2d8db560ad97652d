"""The commands' `--device cuda` give what the CPU gives: predict and the server's /classify reading a long text
in windows, readmission evaluate and score, embed, and an index built on the GPU. Marked `gpu` (`make test-gpu`);
without a GPU they skip, saying why."""
import csv
import json

import numpy as np
import pytest
import torch

from bertforge import BertConfig, BertForMaskedLM, BertTokenizer, Embedder
from bertforge.cli.parser import main
from serve_support import tiny_classifier

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
DEVICES = ("cuda", "cpu")  # each test runs a command on both and compares

TEXTS = ["The tablets eased my headache within an hour.", "No change at all after two weeks.",
         "word " * 700]  # the last is read in windows: longer than the classifier's 512 positions


@pytest.fixture(scope="module")
def classifier(tmp_path_factory, minilm_dir):
    return tiny_classifier(tmp_path_factory.mktemp("classifier") / "sentiment", minilm_dir)


def run(*argv: str, capsys=None) -> str:
    if capsys:
        capsys.readouterr()
    assert main(list(argv)) == 0
    return capsys.readouterr().out if capsys else ""


def test_predict_on_the_gpu_equals_the_cpu_long_texts_in_windows(classifier, tmp_path):
    source = tmp_path / "texts.csv"
    with open(source, "w", newline="", encoding="utf-8") as file:
        csv.writer(file).writerows([["text"], *[[text] for text in TEXTS]])
    answers = []
    for number, device in enumerate(DEVICES):
        output = tmp_path / f"predictions-{number}.jsonl"
        run("predict", "--model", str(classifier), "--input", str(source), "--output", str(output), "--device", device)
        answers.append([json.loads(line) for line in output.read_text().splitlines()])
    assert [row["prediction"] for row in answers[0]] == [row["prediction"] for row in answers[1]]
    for on_gpu, on_cpu in zip(*answers):
        numbers = [key for key, value in on_cpu.items() if isinstance(value, float)]
        assert numbers and all(abs(on_gpu[key] - on_cpu[key]) < 1e-4 for key in numbers)


def test_the_server_on_the_gpu_reads_a_long_text_as_predict_does(classifier, minilm_dir):
    from fastapi.testclient import TestClient

    from bertforge.serve.app import create_app
    from bertforge.serve.models import load_models
    from bertforge.tasks.finetune import load_for_prediction

    task, model = load_for_prediction(classifier)
    expected = task.document_scores(model.eval(), task.windows([(TEXTS[-1],)]), 8, torch.device("cpu"))[0]
    models = load_models(str(minilm_dir), classifier=str(classifier), device=DEVICES[0])
    with TestClient(create_app(models)) as client:
        answer = client.post("/classify", json={"inputs": TEXTS[-1]})
        assert answer.status_code == 200
        by_label = {prediction["label"]: prediction["score"] for prediction in answer.json()}
        served = [by_label[label] for label in model.config.id2label.values()]
        np.testing.assert_allclose(served, expected, atol=1e-4)
        embedded = client.post("/embed", json={"inputs": TEXTS[:2]}).json()
    on_cpu = Embedder.from_pretrained(minilm_dir, device="cpu").encode(TEXTS[:2])
    np.testing.assert_allclose(embedded, on_cpu, atol=1e-4)


@pytest.fixture(scope="module")
def readmission_model(tmp_path_factory, minilm_dir):
    root = tmp_path_factory.mktemp("readmission")
    torch.manual_seed(0)
    config = BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37)
    BertForMaskedLM(config).save_pretrained(root / "tiny", tokenizer=BertTokenizer.from_pretrained(minilm_dir))
    run("readmission", "prepare", "--generate", "120", "--output", str(root / "data"))
    run("readmission", "train", "--data", str(root / "data"), "--kind", "bert", "--init-from", str(root / "tiny"),
        "--epochs", "1", "--max-length", "64", "--output", str(root / "run"))  # on the GPU: the default device
    return root


def test_readmission_evaluate_and_score_on_the_gpu_equal_the_cpu(readmission_model, capsys):
    root = readmission_model
    model = str(root / "run" / "best")
    printed = [run("readmission", "evaluate", "--model", model, "--data", str(root / "data"), "--device", device,
                   capsys=capsys) for device in DEVICES]
    assert printed[0] == printed[1] and "auroc" in printed[1].lower()
    from bertforge.readmission.recipe import Chunks

    note = root / "note.txt"
    note.write_text(" ".join(Chunks.read(root / "data" / "discharge" / "test.csv").texts[:3]), encoding="utf-8")
    scored = [run("readmission", "score", str(note), "--model", model, "--device", device, capsys=capsys)
              for device in DEVICES]
    assert scored[0] == scored[1] and "risk" in scored[1].lower()


def test_embed_and_an_index_built_on_the_gpu_equal_the_cpus(minilm_dir, tmp_path, capsys):
    corpus = tmp_path / "passages.txt"
    corpus.write_text("\n".join(TEXTS[:2] + ["Take it with food to spare your stomach.", "It made me drowsy."]) + "\n")
    hits = []
    for number, device in enumerate(DEVICES):
        vectors = tmp_path / f"vectors-{number}.npy"
        run("embed", str(corpus), str(vectors), "--model", str(minilm_dir), "--device", device)
        index = tmp_path / f"index-{number}"
        run("index", "build", str(corpus), "--output", str(index), "--model", str(minilm_dir), "--device", device)
        printed = run("search", str(index), "upset stomach", "--as-json", "--device", device, capsys=capsys)
        hits.append([json.loads(line) for line in printed.splitlines()])
    np.testing.assert_allclose(np.load(tmp_path / "vectors-0.npy"), np.load(tmp_path / "vectors-1.npy"), atol=1e-4)
    assert [hit["id"] for hit in hits[0]] == [hit["id"] for hit in hits[1]] and "food" in hits[1][0]["text"]
    np.testing.assert_allclose([hit["score"] for hit in hits[0]], [hit["score"] for hit in hits[1]], atol=1e-4)
