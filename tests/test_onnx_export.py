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
    if check_pooler:
        assert np.abs(outputs["pooler_output"] - expected.pooler_output.numpy()).max() <= 1e-4
    else:  # a masked LM has no pooler (transformers builds it without): a random one was exported, new each load
        assert "pooler_output" not in outputs
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
    outputs, encoded = run_onnx(exported, texts)  # its MLM head too, as fill-mask reads it (it was dropped)
    real = encoded["attention_mask"].astype(bool)
    np.testing.assert_allclose(outputs["logits"][real], head_outputs(cassette_dir, encoded)["logits"][real], atol=1e-3)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging folder left


def head_outputs(folder, encoded) -> dict:
    """transformers' own outputs of the head model config.json names, on the encoded batch."""
    import json
    import torch
    import transformers

    architecture = json.loads((folder / "config.json").read_text())["architectures"][0]
    model = getattr(transformers, architecture).from_pretrained(folder).eval()
    with torch.no_grad():
        answer = model(**{name: torch.from_numpy(encoded[name]).long()
                          for name in ("input_ids", "attention_mask", "token_type_ids")})
    return {name: getattr(answer, name).numpy() for name in ("logits", "start_logits", "end_logits")
            if getattr(answer, name, None) is not None}


@pytest.mark.parametrize("architecture, names", [  # one head in make test; the others, each an export, -m slow
    ("BertForQuestionAnswering", ["start_logits", "end_logits"]),
    pytest.param("BertForSequenceClassification", ["logits"], marks=pytest.mark.slow),
    pytest.param("BertForTokenClassification", ["logits"], marks=pytest.mark.slow)])
def test_a_fine_tuned_head_is_exported_with_its_outputs(architecture, names, tmp_path, minilm_dir, data_dir):
    """A fine-tuned folder exported only its encoder (exit 0): its logits were gone. Now they are outputs under
    transformers' (and optimum's) names, equal to transformers' own on real texts of many lengths."""
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=37, num_labels=2 if len(names) == 2 else 3)  # QA: 2
    getattr(transformers, architecture)(config).save_pretrained(tmp_path / "model")
    transformers.BertTokenizerFast.from_pretrained(minilm_dir).save_pretrained(tmp_path / "model")
    assert main(["export", "onnx", str(tmp_path / "model"), str(tmp_path / "onnx")]) == 0
    outputs, encoded = run_onnx(tmp_path / "onnx", emma_lines(data_dir, 9))
    expected, real = head_outputs(tmp_path / "model", encoded), encoded["attention_mask"].astype(bool)
    assert list(outputs)[-len(names):] == names
    assert ("pooler_output" in outputs) == (architecture == "BertForSequenceClassification")
    for name in names:  # a token's outputs are compared where it is real (padded ones mean nothing)
        per_token = outputs[name].shape[:2] == real.shape
        got, want = (outputs[name][real], expected[name][real]) if per_token else (outputs[name], expected[name])
        np.testing.assert_allclose(got, want, atol=1e-4)


def test_export_refuses_a_folder_in_use_and_an_unknown_pooling(capsys, tmp_path, cassette_dir):
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "keep.txt").write_text("mine")
    assert main(["export", "onnx", str(cassette_dir), str(tmp_path / "busy")]) == 2
    assert "already exists and is not an empty folder" in capsys.readouterr().err
    assert (tmp_path / "busy" / "keep.txt").read_text() == "mine"
    assert main(["export", "onnx", str(cassette_dir), str(tmp_path / "new"), "--pooling", "sum"]) == 2
    assert "argument --pooling: invalid choice: 'sum'" in capsys.readouterr().err
    # a masked LM has no pooler: the command line's mistake, exit 2 as the others (it was 1)
    assert main(["export", "onnx", str(cassette_dir), str(tmp_path / "new"), "--pooling", "pooler"]) == 2
    assert "has no pooler" in capsys.readouterr().err and not (tmp_path / "new").exists()


def test_a_model_of_few_positions_is_exported_and_checked_within_them(tmp_path, cassette_dir, capsys):
    """A table of 16 positions failed the export 40 frames deep: the check texts (21 tokens) were not cut to it."""
    from bertforge import BertConfig

    config = BertConfig(vocab_size=30522, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=16)
    BertModel(config).save_pretrained(tmp_path / "short", tokenizer=BertTokenizer.from_pretrained(cassette_dir))
    assert main(["export", "onnx", str(tmp_path / "short"), f"{tmp_path / 'onnx'}/"]) == 0  # as a shell completes it
    assert f"wrote {tmp_path / 'onnx' / 'model.onnx'}; ONNX Runtime matches PyTorch" in capsys.readouterr().out
    outputs, encoded = run_onnx(tmp_path / "onnx", ["Hello there."])
    assert outputs["last_hidden_state"].shape == (1, encoded["input_ids"].shape[1], 16)


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
    assert (written["prompts"], written["default_prompt_name"]) == (
        {"query": "query: ", "document": "", "passage": ""}, "query")


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


def test_normalize_without_a_sentence_vector_is_refused_in_one_line(cassette_dir, tmp_path, capsys):
    """`export onnx PLAIN OUT --normalize` exited 0 with no sentence_embedding in the graph and nothing said."""
    from bertforge.cli.parser import main

    assert main(["export", "onnx", str(cassette_dir), str(tmp_path / "out"), "--normalize"]) == 2
    error = capsys.readouterr().err
    assert "--normalize needs a sentence vector" in error and "--pooling mean" in error
    assert not (tmp_path / "out").exists()
