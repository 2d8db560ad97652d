"""BertConfig: the model's hyper-parameters, with Hugging Face `config.json` field names."""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..validation import Bound, checked

CONFIG_NAME = "config.json"

# The BERT paper family (Devlin et al. 2018; Turc et al. 2019 "Well-Read Students"):
# name -> (layers, hidden). Heads are hidden / 64 and the feed-forward is 4 x hidden.
PRESETS: dict[str, tuple[int, int]] = {
    "tiny": (2, 128),
    "mini": (4, 256),
    "small": (4, 512),
    "medium": (8, 512),
    "base": (12, 768),
    "large": (24, 1024),
}

SUPPORTED_ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu")


@dataclass
class BertConfig:
    """Hyper-parameters of a BERT encoder; defaults are BERT-base uncased."""

    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    pad_token_id: int = 0
    # Task heads: labels for classification, and how the sequence head scores them.
    id2label: dict[int, str] | None = None
    problem_type: str | None = None  # single_label_classification | multi_label_classification | regression
    classifier_dropout: float | None = None
    architectures: list[str] | None = None
    # Keys we do not model (model_type, torch_dtype, transformers_version, ...) are kept
    # so that a load/save round trip does not lose anything the user's tools rely on.
    extra: dict[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be a multiple of num_attention_heads "
                f"({self.num_attention_heads}): each head gets hidden_size / heads dimensions"
            )
        if self.hidden_act not in SUPPORTED_ACTIVATIONS:
            raise ValueError(
                f"hidden_act={self.hidden_act!r} is not supported; use one of {SUPPORTED_ACTIVATIONS}"
            )
        if self.id2label is not None:
            self.id2label = {int(k): v for k, v in self.id2label.items()}

    @property
    def num_labels(self) -> int:
        return len(self.id2label) if self.id2label else 2

    @property
    def label2id(self) -> dict[str, int]:
        return {label: i for i, label in (self.id2label or {}).items()}

    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> "BertConfig":
        """A paper-family size by name (tiny, mini, small, medium, base, large)."""
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
        layers, hidden = PRESETS[name]
        sizes = dict(
            num_hidden_layers=layers,
            hidden_size=hidden,
            num_attention_heads=hidden // 64,
            intermediate_size=4 * hidden,
        )
        return cls(**{**sizes, **overrides})

    # ---- HF config.json ----------------------------------------------------------

    @property
    def ties_word_embeddings(self) -> bool:
        """Whether the MLM decoder is the word-embedding matrix (transformers' `tie_word_embeddings`, true unless a
        config says false: then the decoder has weights of its own, read and saved as cls.predictions.decoder)."""
        return bool(self.extra.get("tie_word_embeddings", True))

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "BertConfig":
        known = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        kwargs = {k: v for k, v in values.items() if k in known}
        extra = {k: v for k, v in values.items() if k not in known and k != "label2id"}
        if "num_labels" in extra and "id2label" not in kwargs:
            kwargs["id2label"] = {i: f"LABEL_{i}" for i in range(extra.pop("num_labels"))}
        extra.pop("num_labels", None)
        return cls(**kwargs, extra=extra)

    def to_dict(self) -> dict[str, Any]:
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "extra"}
        values = {k: v for k, v in values.items() if v is not None}
        if self.id2label:
            values["id2label"] = {str(i): label for i, label in self.id2label.items()}
            values["label2id"] = self.label2id
        return {"model_type": "bert", **self.extra, **values}

    @classmethod
    def from_json_file(cls, path: str | Path) -> "BertConfig":
        path = Path(path)
        try:
            values = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ValueError(f"no {path.name} at {path}: is this a BERT checkpoint folder?") from None
        except json.JSONDecodeError as error:
            raise ValueError(f"{path} is not valid JSON ({error}); restore or re-export it") from None
        if not isinstance(values, dict):
            raise ValueError(f"{path} must hold a JSON object of config fields")
        check_bert_config(values, path)
        return cls.from_dict(values)

    def checked_max_length(self, max_length, where: str = "", name: str = "max_length") -> int:
        """max_length as an int that the position table holds ([CLS] + [SEP] at the least, max_position_embeddings
        at most); UsageError naming the bound otherwise. Checked where the length enters, before any work: past
        the table the forward pass fails mid-run."""
        return checked(name, max_length, where=where, bound=Bound(
            2, self.max_position_embeddings, meaning="[CLS] + [SEP] at the least, the model's max_position_embeddings "
                                                     "at most"))

    def to_json_file(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n", encoding="utf-8")


def check_bert_config(values: dict, path: Path) -> None:
    """Raise ValueError, one line naming the file, for a config.json of a model this BertModel would misread:
    another model type (RoBERTa and ELECTRA name their weights as BERT does and loaded without a word, their outputs
    off by up to 2.3; DistilBERT's sizes went unread) or a BERT decoder (`is_decoder`: causal attention, where
    this encoder attends both ways). A config without `model_type` (an older BERT's) is read as BERT."""
    model_type = values.get("model_type")
    if model_type is not None and model_type != "bert":
        raise ValueError(f"{path} is a {model_type} checkpoint (model_type {model_type!r}); bertforge reads BERT "
                         "(model_type 'bert'): use a BERT checkpoint, or transformers for this one")
    if values.get("is_decoder"):
        raise ValueError(f"{path} is a BERT decoder (is_decoder true: each token attends to those before it); "
                         "bertforge's BertModel is the encoder, which attends both ways: use transformers for it")
