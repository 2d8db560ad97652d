"""Sentence, word and token vectors from a BERT encoder.

`Embedder` holds a model, its tokenizer and the choices that shape a vector (which
hidden layers, how they are combined, how tokens are pooled); `embed`, `word_vector`
and `token_vectors` are one-call wrappers. Texts are tokenized in windows, sorted by
token count and batched longest first, so each batch is padded only to its own
longest text; vectors come back in the caller's order.

Hidden states are indexed as in `EncoderOutput.hidden_states`: 0 is the embedding
layer's output, 1..N the encoder layers, -1 the last.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
from pathlib import Path
from typing import Iterable, Literal, Sequence, get_args

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from tqdm.auto import tqdm

from ..models.model import BertModel
from ..models.outputs import EncoderOutput
from ..tokenization.tokenizer import BertTokenizer

Pooling = Literal["cls", "mean", "max", "pooler"]
LayerCombine = Literal["mean", "concat"]
POOLINGS, LAYER_COMBINES = get_args(Pooling), get_args(LayerCombine)
# Readable names for the layer choices people make by hand (Devlin et al. 2018, table 7).
LAYER_ALIASES: dict[str, tuple[tuple[int, ...], str | None]] = {
    "last": ((-1,), None),
    "second_to_last": ((-2,), None),
    "last_four_mean": ((-4, -3, -2, -1), "mean"),
    "last_four_concat": ((-4, -3, -2, -1), "concat"),
}
AUTOCAST_DTYPES = (torch.bfloat16, torch.float16)
# Texts tokenized (and length-sorted) together: large enough that sorting removes nearly
# all padding, small enough that the padded id tensors stay a few MB.
TOKENIZE_WINDOW = 4096
# With more batches than this, `progress=None` shows a progress bar.
AUTO_PROGRESS_BATCHES = 16
# sentence-transformers folders record here the sequence length SentenceTransformer truncates to.
SENTENCE_TRANSFORMERS_CONFIG = "sentence_bert_config.json"

LayerSpec = int | str | Sequence[int]


# --- pooling: (batch, seq, dim) token states + (batch, seq) 1/0 mask -> (batch, dim) ----------

def cls_pool(states: Tensor, attention_mask: Tensor) -> Tensor:
    return states[:, 0]


def mean_pool(states: Tensor, attention_mask: Tensor) -> Tensor:
    """Mean over real tokens, written as sentence-transformers' Pooling(mean) so vectors match it."""
    mask = attention_mask.unsqueeze(-1).to(states.dtype)
    return (states * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)


def max_pool(states: Tensor, attention_mask: Tensor) -> Tensor:
    """Element-wise max over real tokens; padding is -inf so it never wins."""
    padding = attention_mask.unsqueeze(-1) == 0
    return states.masked_fill(padding, float("-inf")).max(dim=1).values


POOL_FUNCTIONS = {"cls": cls_pool, "mean": mean_pool, "max": max_pool}


# --- validation of user input, once, where it enters -------------------------------------------

def resolve_encoder(model) -> BertModel:
    """The BertModel inside what the user passed: the model itself or a head's `.bert`."""
    if isinstance(model, BertModel):
        return model
    if isinstance(getattr(model, "bert", None), BertModel):
        return model.bert
    raise ValueError(
        f"expected a bertforge BertModel, a head model with a `.bert` encoder, or a checkpoint folder; "
        f"got {type(model).__module__}.{type(model).__qualname__}. Load weights with bertforge.BertModel.from_pretrained(folder)"
    )


def resolve_layers(layers: LayerSpec, layer_combine: str | None, num_layers: int) -> tuple[tuple[int, ...], str]:
    """Layer choice -> (absolute hidden-state indices in 0..num_layers, combine mode).

    Raises ValueError for an unknown alias or combine mode, an empty list, a non-int
    index, or an index outside the model's layers.
    """
    if layer_combine is not None and layer_combine not in LAYER_COMBINES:
        raise ValueError(f"layer_combine={layer_combine!r} is not one of {LAYER_COMBINES}")
    if isinstance(layers, str):
        if layers not in LAYER_ALIASES:
            raise ValueError(
                f"layers={layers!r} is not a known alias; use one of {tuple(LAYER_ALIASES)}, "
                "an int (-1 last, 0 embeddings) or a list of ints"
            )
        indices, alias_combine = LAYER_ALIASES[layers]
        if alias_combine and layer_combine not in (None, alias_combine):
            raise ValueError(f"layers={layers!r} already means layer_combine={alias_combine!r}; drop layer_combine")
        layer_combine = alias_combine
    else:
        indices = (layers,) if isinstance(layers, int) else tuple(layers)
    if not indices:
        raise ValueError("layers is empty; pass at least one layer index, e.g. layers=-1")
    return tuple(absolute_layer(i, num_layers) for i in indices), layer_combine or "mean"


def absolute_layer(index, num_layers: int) -> int:
    # bool is an int subclass, and layers=True is surely a mistake.
    if not isinstance(index, (int, np.integer)) or isinstance(index, bool):
        raise ValueError(f"layer index {index!r} is not an int; use e.g. -1 (last) or 0 (embeddings)")
    if not -(num_layers + 1) <= index <= num_layers:
        raise ValueError(
            f"layer {index} is out of range: the model has {num_layers} layers, so hidden states are "
            f"0 (embeddings) to {num_layers}, or -{num_layers + 1} to -1 counting from the end"
        )
    return int(index) % (num_layers + 1)


def check_texts(texts: Iterable[str]) -> list[str]:
    """A list of str, or ValueError naming the first item that is not one."""
    if isinstance(texts, str):
        raise ValueError("texts is a single str; pass a list of texts, e.g. [text]")
    texts = list(texts)
    for index, text in enumerate(texts):
        if not isinstance(text, str):
            hint = " (a missing value read from a table is a float NaN: drop or fill it)" if isinstance(text, float) else ""
            raise ValueError(f"texts[{index}] is {type(text).__name__}, not str{hint}")
    return texts


def check_sentence(sentence) -> str:
    if not isinstance(sentence, str):
        raise ValueError(f"sentence must be a str, got {type(sentence).__name__}")
    return sentence


def check_autocast_dtype(dtype: torch.dtype | None) -> torch.dtype | None:
    if dtype is None or dtype == torch.float32:
        return None
    if dtype not in AUTOCAST_DTYPES:
        raise ValueError(f"dtype={dtype} is not supported; use torch.bfloat16, torch.float16 or None (float32)")
    return dtype


def check_max_length(max_length: int | None, tokenizer, model: BertModel) -> int:
    """The truncation length: the user's, or the tokenizer's limit, never past the position table."""
    positions = model.config.max_position_embeddings
    if max_length is None:
        return min(int(getattr(tokenizer, "model_max_length", positions)), positions)
    if not isinstance(max_length, int) or not 2 <= max_length <= positions:
        raise ValueError(
            f"max_length={max_length!r} must be an int from 2 ([CLS] + [SEP]) to {positions}, "
            "the model's max_position_embeddings"
        )
    return max_length


def check_positive(name: str, value) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name}={value!r} must be a positive int")
    return value


@contextlib.contextmanager
def eval_mode(model: torch.nn.Module):
    """Dropout off while embedding, and the caller's train/eval mode given back afterwards."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


class Embedder:
    """A model, its tokenizer and the vector choices, reusable across many `encode` calls.

    layers: an int (-1 last, -2 second to last, 0 the embedding layer's output), a list
        of ints combined by `layer_combine` ("mean" by default, or "concat"), or an alias:
        "last", "second_to_last", "last_four_mean", "last_four_concat".
    pooling: "mean" (over real tokens, as sentence-transformers), "max" (over real tokens),
        "cls" (the [CLS] vector) or "pooler" (the model's pooler_output; last layer only).
    normalize: L2-normalise sentence vectors (then a dot product is the cosine).
    max_length: truncation in tokens; default the tokenizer's limit, capped at the
        model's position table.
    progress: True/False to force a tqdm bar on or off; None shows one for long inputs.
    device: where to run; the model is moved there. Default: where the model already is.
    dtype: torch.bfloat16 or torch.float16 runs the model under autocast; vectors are
        always returned as float32.

    `pooling` and `normalize` shape `encode`'s sentence vectors only; `word_vector` and
    `token_vectors` use the same layers but return unpooled, unnormalised vectors.
    Raises ValueError for any invalid choice, naming the valid ones.
    """

    def __init__(self, model, tokenizer, *, layers: LayerSpec = -1, layer_combine: str | None = None,
                 pooling: str = "mean", normalize: bool = False, batch_size: int = 32,
                 max_length: int | None = None, progress: bool | None = None,
                 device: str | torch.device | None = None, dtype: torch.dtype | None = None):
        self.model = resolve_encoder(model)
        if tokenizer is None:
            raise ValueError(
                "tokenizer is required with a model object (the model does not know its vocabulary): "
                "pass tokenizer=BertTokenizer.from_pretrained(folder), or pass the checkpoint folder instead"
            )
        self.tokenizer = tokenizer
        num_layers = self.model.config.num_hidden_layers
        self.layers, self.layer_combine = resolve_layers(layers, layer_combine, num_layers)
        if pooling not in POOLINGS:
            raise ValueError(f"pooling={pooling!r} is not one of {POOLINGS}")
        if pooling == "pooler":
            self.check_pooler_allowed(num_layers)
        self.pooling = pooling
        self.normalize = bool(normalize)
        self.batch_size = check_positive("batch_size", batch_size)
        self.max_length = check_max_length(max_length, tokenizer, self.model)
        self.progress = progress
        self.dtype = check_autocast_dtype(dtype)
        if device is not None:
            self.model.to(device)
        self.device = next(self.model.parameters()).device

    def check_pooler_allowed(self, num_layers: int) -> None:
        if self.layers != (num_layers,):
            raise ValueError("pooling='pooler' reads the last layer's [CLS]; use it with layers=-1, or pick 'cls'")
        if self.model.pooler is None:
            raise ValueError("this model has no pooler (it was built without one); use pooling='cls' or 'mean'")

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, tokenizer=None, **options) -> "Embedder":
        """Load BertModel (and BertTokenizer, unless given) from a checkpoint folder; options as in `Embedder`.

        Without max_length, a sentence-transformers folder's `max_seq_length` is used (256
        for all-MiniLM-L6-v2): the length its authors chose and `SentenceTransformer.encode`
        truncates to, so long texts give the same vectors as there.
        """
        model = BertModel.from_pretrained(path)
        tokenizer = tokenizer if tokenizer is not None else BertTokenizer.from_pretrained(path)
        if options.get("max_length") is None:
            options["max_length"] = sentence_transformers_max_length(Path(path))
        return cls(model, tokenizer, **options)

    @property
    def dim(self) -> int:
        """Length of each returned vector: hidden size, times the number of layers when concatenated."""
        hidden = self.model.config.hidden_size
        return hidden * len(self.layers) if self.layer_combine == "concat" else hidden

    # --- sentence vectors ------------------------------------------------------------------

    def encode(self, texts: Iterable[str]) -> np.ndarray:
        """texts -> float32 array (len(texts), dim), row i for texts[i].

        Raises ValueError when texts is a single str or holds a non-str item.
        """
        texts = check_texts(texts)
        vectors = np.zeros((len(texts), self.dim), dtype=np.float32)
        num_batches = -(-len(texts) // self.batch_size)
        show = self.progress if self.progress is not None else num_batches > AUTO_PROGRESS_BATCHES
        with tqdm(total=len(texts), unit="text", disable=not show) as bar:
            for start in range(0, len(texts), TOKENIZE_WINDOW):
                window = texts[start:start + TOKENIZE_WINDOW]
                for rows, batch in self.length_sorted_batches(window):
                    vectors[start + rows.numpy()] = self.sentence_vectors(batch).numpy()
                    bar.update(len(rows))
        return vectors

    def length_sorted_batches(self, texts: list[str]):
        """Yield (row indices into texts, encoded batch), longest texts first.

        The window is padded once to its longest text; each batch is cut back to its own
        longest (padding is on the right), so short texts never pay for long ones.
        """
        encoded = self.tokenize(texts)
        lengths = encoded["attention_mask"].sum(dim=1)
        order = torch.argsort(lengths, descending=True, stable=True)
        for rows in order.split(self.batch_size):
            width = int(lengths[rows[0]])
            yield rows, {name: encoded[name][rows, :width] for name in ("input_ids", "token_type_ids", "attention_mask")}

    def sentence_vectors(self, batch: dict[str, Tensor]) -> Tensor:
        """One encoded batch -> (batch, dim) float32 sentence vectors on the CPU."""
        output = self.forward(batch)
        if self.pooling == "pooler":
            vectors = output.pooler_output.float()
        else:
            vectors = POOL_FUNCTIONS[self.pooling](self.layer_states(output), batch["attention_mask"].to(self.device))
        if self.normalize:
            vectors = F.normalize(vectors, p=2, dim=1)
        return vectors.cpu()

    # --- token and word vectors ------------------------------------------------------------

    def token_vectors(self, sentence: str) -> tuple[list[str], np.ndarray]:
        """One sentence -> (its tokens, float32 array (num_tokens, dim)), [CLS] and [SEP] included.

        Raises ValueError when sentence is not a str.
        """
        encoded = self.tokenize([check_sentence(sentence)])
        states = self.layer_states(self.forward(encoded))[0].cpu()  # (seq, dim)
        tokens = self.tokenizer.convert_ids_to_tokens(encoded["input_ids"][0].tolist())
        return tokens, states.numpy()

    def word_vector(self, sentence: str, word: str, occurrence: int = 0) -> np.ndarray:
        """The vector of `word` (a word or phrase) in `sentence`: float32 (dim,), the mean of its pieces.

        `word` is found as a whole word, case-insensitively; `occurrence` picks which match
        (0 the first, -1 the last). Its sub-word pieces are the tokens whose character
        offsets overlap the match, so the sentence is encoded as written (no [MASK]).
        Raises ValueError when the word does not occur, `occurrence` is out of range, or the
        word falls (even partly) past the max_length truncation.
        """
        start, end = find_word(check_sentence(sentence), word, occurrence)
        encoded = self.tokenize([sentence], offsets=True)
        offsets = encoded["offset_mapping"][0].tolist()
        pieces = [i for i, (a, b) in enumerate(offsets) if b > a and a < end and b > start]
        if not pieces or offsets[pieces[-1]][1] < end:
            raise ValueError(
                f"{word!r} (characters {start}-{end}) falls past the truncation at max_length={self.max_length} "
                f"tokens; pass a larger max_length (this model takes up to "
                f"{self.model.config.max_position_embeddings}) or a shorter sentence"
            )
        states = self.layer_states(self.forward(encoded))[0]  # (seq, dim)
        return states[pieces].mean(dim=0).cpu().numpy()

    # --- the model ---------------------------------------------------------------------------

    def tokenize(self, texts: list[str], offsets: bool = False):
        return self.tokenizer(texts, truncation=True, max_length=self.max_length, padding=True,
                              return_tensors="pt", return_offsets_mapping=offsets)

    def forward(self, batch) -> EncoderOutput:
        """Run the encoder without autograd, dropout off, under autocast when a dtype was chosen."""
        wants_hidden_states = self.layers != (self.model.config.num_hidden_layers,)
        autocast = (torch.autocast(self.device.type, dtype=self.dtype) if self.dtype is not None
                    else contextlib.nullcontext())
        with torch.inference_mode(), eval_mode(self.model), autocast:
            return self.model(
                batch["input_ids"].to(self.device),
                attention_mask=batch["attention_mask"].to(self.device),
                token_type_ids=batch["token_type_ids"].to(self.device),
                output_hidden_states=wants_hidden_states,
            )

    def layer_states(self, output: EncoderOutput) -> Tensor:
        """The chosen layers' token states, combined: float32 (batch, seq, dim)."""
        if output.hidden_states is None:
            return output.last_hidden_state.float()
        states = [output.hidden_states[i].float() for i in self.layers]
        if len(states) == 1:
            return states[0]
        if self.layer_combine == "concat":
            return torch.cat(states, dim=-1)
        return torch.stack(states).mean(dim=0)


def find_word(sentence: str, word: str, occurrence: int) -> tuple[int, int]:
    """Character span [start, end) of the chosen whole-word, case-insensitive match of word."""
    if not isinstance(word, str) or not word.strip():
        raise ValueError(f"word={word!r} must be a non-empty str")
    # Whole words ("bank" is not found inside "banking"); any run of whitespace between a phrase's words.
    pattern = r"(?<!\w)" + r"\s+".join(map(re.escape, word.split())) + r"(?!\w)"
    matches = [m.span() for m in re.finditer(pattern, sentence, flags=re.IGNORECASE)]
    if not matches:
        raise ValueError(f"{word.strip()!r} is not in the sentence {sentence!r} (matched as a whole word, ignoring case)")
    if not isinstance(occurrence, int) or not -len(matches) <= occurrence < len(matches):
        raise ValueError(
            f"occurrence={occurrence!r} is out of range: {word.strip()!r} occurs {len(matches)} time(s) in the sentence "
            f"(use 0 to {len(matches) - 1}, or -1 for the last)"
        )
    return matches[occurrence]


def sentence_transformers_max_length(folder: Path) -> int | None:
    config_file = folder / SENTENCE_TRANSFORMERS_CONFIG
    if not config_file.is_file():
        return None
    return json.loads(config_file.read_text(encoding="utf-8")).get("max_seq_length")


def embedder_for(model_or_path, tokenizer=None, **options) -> Embedder:
    """An Embedder from a checkpoint folder, or from a model object and its tokenizer."""
    if isinstance(model_or_path, (str, os.PathLike)):
        return Embedder.from_pretrained(model_or_path, tokenizer, **options)
    return Embedder(model_or_path, tokenizer, **options)


# --- one-call wrappers -----------------------------------------------------------------------

def embed(model_or_path, texts: Iterable[str], layers: LayerSpec = -1, pooling: str = "mean",
          normalize: bool = False, batch_size: int = 32, max_length: int | None = None, tokenizer=None,
          layer_combine: str | None = None, progress: bool | None = None,
          device: str | torch.device | None = None, dtype: torch.dtype | None = None) -> np.ndarray:
    """Sentence vectors for texts: float32 (len(texts), dim), in the order of texts.

    model_or_path: a checkpoint folder (model and tokenizer are loaded from it), or a
    BertModel / head model together with `tokenizer`. The other arguments are `Embedder`'s.
    To embed many lists with one model, build an `Embedder` once and call `.encode`.
    Raises ValueError for invalid input or options.
    """
    embedder = embedder_for(model_or_path, tokenizer, layers=layers, layer_combine=layer_combine, pooling=pooling,
                            normalize=normalize, batch_size=batch_size, max_length=max_length,
                            progress=progress, device=device, dtype=dtype)
    return embedder.encode(texts)


def word_vector(model_or_path, tokenizer, sentence: str, word: str, occurrence: int = 0,
                layers: LayerSpec = -1, layer_combine: str | None = None, **options) -> np.ndarray:
    """The in-context vector of `word` in `sentence`: float32 (dim,). See `Embedder.word_vector`."""
    embedder = embedder_for(model_or_path, tokenizer, layers=layers, layer_combine=layer_combine, **options)
    return embedder.word_vector(sentence, word, occurrence)


def token_vectors(model_or_path, tokenizer, sentence: str, layers: LayerSpec = -1,
                  layer_combine: str | None = None, **options) -> tuple[list[str], np.ndarray]:
    """(tokens, float32 (num_tokens, dim)) for one sentence. See `Embedder.token_vectors`."""
    embedder = embedder_for(model_or_path, tokenizer, layers=layers, layer_combine=layer_combine, **options)
    return embedder.token_vectors(sentence)
