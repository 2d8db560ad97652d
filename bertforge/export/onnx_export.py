"""A checkpoint as an ONNX model, checked against ONNX Runtime before it is published.

The graph takes input_ids, attention_mask and token_type_ids, int64 (batch, sequence), both
axes dynamic, and returns last_hidden_state (batch, sequence, hidden), pooler_output
(batch, hidden) when the model has a pooler, and, when a pooling is chosen or the folder is a
sentence-transformers one, sentence_embedding (batch, hidden) made as `Embedder` makes it (by default
with the folder's own pooling and Normalize, `models.folder`). A checkpoint with a task head (HEAD_OUTPUTS)
adds the head's outputs under transformers' and optimum's names (logits; start_logits and end_logits), and has
a pooler_output only where its model has one (a sequence classifier; not a masked LM, a token classifier or a QA
model, which transformers builds without it). The folder written holds model.onnx, the config and the tokenizer
files, so it is all a runtime needs; a folder's default prompt (config_sentence_transformers.json) is the
runtime's to put before each text, as sentence-transformers' own ONNX backend does.
"""
from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..atomic import published_folder
from ..embeddings.pooling import pool, pooling_modes
from ..errors import UsageError
from ..models import heads
from ..models.checkpoint import has_mlm_head
from ..models.folder import ModelFolder, read_model_folder
from ..models.model import BertModel
from ..tokenization.folder import load_tokenizer
from ..tokenization.tokenizer import BertTokenizer

INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")
OPSET = 18
# What ONNX Runtime may differ from PyTorch by on the check texts (float32; measured ~2e-6 on MiniLM).
TOLERANCE = 1e-4
# A task head's outputs, by the architecture config.json names: what `predict` and fill-mask read from it.
HEAD_OUTPUTS = {"BertForSequenceClassification": ("logits",), "BertForTokenClassification": ("logits",),
                "BertForQuestionAnswering": ("start_logits", "end_logits"), "BertForMaskedLM": ("logits",)}
CHECK_TEXTS = ["Hello.", "A longer sentence, so that the batch has padding to mask.",
               "Emma Woodhouse, handsome, clever, and rich, with a comfortable home and happy disposition."]


class ExportedEncoder(nn.Module):
    """BertModel itself, plus the sentence pooling and a task head's outputs, with fixed inputs and a tuple of
    outputs for export.

    The graph is traced through `BertModel.forward` (and the head's own forward), not a copy of it: the one
    data-dependent branch there (no mask when nothing is padded, `key_mask_from`) is taken only in eager CPU
    code, never under torch.export's tracing, so the exported graph always applies the mask.
    """

    def __init__(self, model: BertModel, pooling: str | None, normalize: bool, head: nn.Module | None = None,
                 head_outputs: tuple[str, ...] = ()):
        super().__init__()
        self.bert, self.pooling, self.normalize = model, pooling, normalize
        self.head, self.head_outputs = head, head_outputs

    def forward(self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor) -> tuple[Tensor, ...]:
        if self.head is None:
            encoded = self.bert(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
            hidden_states, pooled, task = encoded.last_hidden_state, encoded.pooler_output, []
        else:  # the encoder runs once, inside the head; its last hidden states come back beside the logits
            answer = self.head(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                               output_hidden_states=True)
            hidden_states, task = answer.hidden_states[-1], [getattr(answer, name) for name in self.head_outputs]
            pooled = self.bert.pooler(hidden_states) if self.bert.pooler is not None else None
        outputs = [hidden_states] + ([pooled] if pooled is not None else [])
        if self.pooling is not None:
            vectors = pooled if self.pooling == "pooler" else pool(hidden_states, attention_mask, self.pooling)
            outputs.append(F.normalize(vectors, p=2, dim=1) if self.normalize else vectors)
        return tuple(outputs + task)

    def output_names(self) -> list[str]:
        names = ["last_hidden_state"] + (["pooler_output"] if self.bert.pooler is not None else [])
        return names + (["sentence_embedding"] if self.pooling is not None else []) + list(self.head_outputs)

    def per_token_outputs(self) -> list[bool]:
        """Per output, whether it has a value per token (the hidden states, a token or span head's logits), whose
        padded positions mean nothing; the pooled vectors and a sequence classifier's logits are per text."""
        per_token_head = not isinstance(self.head, heads.BertForSequenceClassification)
        return [name == "last_hidden_state" or (name in self.head_outputs and per_token_head)
                for name in self.output_names()]


def exported_model(read: ModelFolder) -> tuple[BertModel, nn.Module | None, tuple[str, ...]]:
    """(the encoder, its task head model or None, the head's output names) for a folder: the head its config.json
    names (HEAD_OUTPUTS) when its weights hold one (a BertForMaskedLM label on MiniLM's weights has no MLM head)."""
    outputs = HEAD_OUTPUTS.get(read.architecture, ())
    if read.architecture == "BertForMaskedLM" and not has_mlm_head(read.transformer):
        outputs = ()
    if not outputs:
        return BertModel.from_pretrained(read.transformer).eval(), None, ()
    head = getattr(heads, read.architecture).from_pretrained(read.transformer).eval()
    return head.bert, head, outputs


def export_onnx(folder: str | os.PathLike | ModelFolder, output: str | os.PathLike, pooling: str | None = None,
                normalize: bool | None = None) -> float:
    """Write `output`/model.onnx (+ config and tokenizer) for the model in `folder`; returns the check's max |diff|.

    pooling, normalize: None follows a sentence-transformers folder (its Pooling and Normalize); for a
    plain checkpoint no pooling means no sentence_embedding output, and no normalisation.
    The graph is run in ONNX Runtime on CHECK_TEXTS (padded, so the mask matters) and must
    match PyTorch within TOLERANCE before the folder is published (atomically).
    Raises ValueError for an unknown pooling, normalize without a pooling, an output folder that is not empty,
    or a mismatch; ImportError names the `export` extra when onnx/onnxruntime are missing.
    """
    missing = [name for name in ("onnx", "onnxscript", "onnxruntime") if importlib.util.find_spec(name) is None]
    if missing:
        raise ValueError(f"ONNX export needs {', '.join(missing)}: pip install 'bertforge[export]'")
    if pooling not in (None, "pooler"):
        try:
            pooling_modes(pooling)
        except ValueError as error:
            raise UsageError(str(error)) from None
    output = Path(output)
    if output.exists() and (not output.is_dir() or any(output.iterdir())):
        raise UsageError(f"{output} already exists and is not an empty folder; choose a new folder or remove it")
    read = folder if isinstance(folder, ModelFolder) else read_model_folder(folder)
    if read.sentence_transformers:
        pooling = pooling or read.pooling
        normalize = read.normalize if normalize is None else normalize
    if normalize and pooling is None:  # nothing to normalise: the graph would have no sentence_embedding
        raise UsageError(f"--normalize needs a sentence vector, and {read.root} is a plain checkpoint: add "
                         "--pooling mean (or cls, max) to export a normalised sentence_embedding")
    model, head, head_outputs = exported_model(read)
    if pooling == "pooler" and model.pooler is None:  # the command line's mistake, said as the others are (exit 2)
        raise UsageError(f"this model ({read.architecture}) has no pooler; choose --pooling mean, cls or max")
    tokenizer = load_tokenizer(read)
    graph = ExportedEncoder(model, pooling, bool(normalize), head, head_outputs)
    positions = model.config.max_position_embeddings
    example = check_batch(tokenizer, CHECK_TEXTS, positions)
    with published_folder(output, existing="refuse") as staging:  # an empty folder, checked above
        onnx_file = staging / "model.onnx"
        batch, sequence = torch.export.Dim("batch"), torch.export.Dim("sequence", max=positions)
        with warnings.catch_warnings(), quiet_logger("torch.onnx"), torch.no_grad():
            warnings.simplefilter("ignore")  # the exporter's notes on its own internals (e.g. no torchvision)
            torch.onnx.export(graph, tuple(example[name] for name in INPUT_NAMES), onnx_file, dynamo=True,
                              input_names=list(INPUT_NAMES), output_names=graph.output_names(),
                              dynamic_shapes={name: {0: batch, 1: sequence} for name in INPUT_NAMES},
                              opset_version=OPSET, external_data=False, verbose=False)
        difference = check_with_onnxruntime(onnx_file, graph, tokenizer)
        model.config.to_json_file(staging / "config.json")
        # A runtime truncates where the tokenizer's config says: the folder's max_seq_length (256 for MiniLM,
        # not the 512 positions), as `embed` and sentence-transformers do.
        tokenizer.model_max_length = read.max_seq_length
        tokenizer.save_pretrained(staging)
        write_prompts(read, staging)
    return difference


def write_prompts(read: ModelFolder, staging: Path) -> None:
    """The folder's prompts in sentence-transformers' config, for a runtime to put before each text: the graph
    starts from token ids, so a prompt (e.g. "query: ") is the tokenizer's side, as in `embed`. Nothing for a folder
    whose prompts are all empty (sentence-transformers' standard "query" and "document" alone)."""
    if any(read.prompts.values()):
        values = {"prompts": read.prompts, "default_prompt_name": read.default_prompt_name,
                  "similarity_fn_name": read.similarity_fn_name}
        (staging / "config_sentence_transformers.json").write_text(json.dumps(values, indent=2) + "\n",
                                                                    encoding="utf-8")


@contextlib.contextmanager
def quiet_logger(name: str):
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def check_batch(tokenizer: BertTokenizer, texts: list[str], positions: int):
    """The texts as one padded batch within the model's position table (a table of 16 positions failed the
    export, 40 frames deep, on the check texts' 21 tokens)."""
    return tokenizer(texts, padding=True, truncation=True, max_length=positions, return_tensors="pt")


def check_with_onnxruntime(onnx_file: Path, graph: ExportedEncoder, tokenizer: BertTokenizer) -> float:
    """Max |ONNX Runtime - PyTorch| over every output on a batch of another shape than the example's."""
    import onnxruntime

    texts = CHECK_TEXTS[::-1] + ["One more, of a length of its own, for a new batch shape."]
    encoded = check_batch(tokenizer, texts, graph.bert.config.max_position_embeddings)
    session = onnxruntime.InferenceSession(str(onnx_file), providers=["CPUExecutionProvider"])
    actual = session.run(None, {name: encoded[name].numpy() for name in INPUT_NAMES})
    with torch.no_grad():
        expected = graph(*(encoded[name] for name in INPUT_NAMES))
    real = encoded["attention_mask"].bool().numpy()
    differences = [np.abs(a[real] - e.numpy()[real]).max() if per_token else np.abs(a - e.numpy()).max()
                   for a, e, per_token in zip(actual, expected, graph.per_token_outputs())]
    difference = float(max(differences))
    if not difference <= TOLERANCE:
        raise ValueError(f"the exported graph differs from PyTorch by {difference:.2e} (> {TOLERANCE}) in ONNX Runtime "
                         f"{onnxruntime.__version__}; please report it with your torch and onnx versions")
    return difference
