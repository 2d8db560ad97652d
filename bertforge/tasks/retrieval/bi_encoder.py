"""A bi-encoder: one BERT encodes both sides of a pair into pooled sentence vectors; its forward returns the loss.

`BiEncoder` is what the one training loop trains (`forward(**batch).loss`) and what its
checkpoints save. `save_pretrained` writes a sentence-transformers folder, the layout
UKPLab's library reads (modules.json: Transformer -> Pooling [-> Normalize]):

    config.json, model.safetensors, vocab.txt, tokenizer.json, ...  the BertModel, HF names, at the root
    sentence_bert_config.json        max_seq_length (texts are truncated to it), do_lower_case
    1_Pooling/config.json            the pooling (mean, cls, ...)
    config_sentence_transformers.json  the prompts and the default one's name
    modules.json

so `SentenceTransformer(folder)` gives the vectors `bertforge.embed(folder, ...)` gives; `from_pretrained`
reads any such folder back through `models.folder.read_model_folder` (or any BERT checkpoint), and the
BiEncoder carries what the folder says of its vectors (pooling, Normalize, length, prompts, lower-casing):
training scores the vectors `embed` gives, and saving writes them back.
"""
from __future__ import annotations

import json
import os
from importlib import metadata
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...atomic import published_folder
from ...embeddings.pooling import pool, pooling_modes
from ...engine.unpadding import packing_if_it_pays
from ...models.folder import (MODULES_FILE, ST_CONFIG_FILE, ModelFolder, default_prompt, pooling_config,
                              read_model_folder)
from ...models.model import BertModel
from ...validation import check_fields, checked
from .gradient_cache import cached_loss
from .losses import (LOSSES, cosent_loss, cosine_similarity_loss, matryoshka, score_distillation_loss,
                     multiple_negatives_ranking_loss)

SENTENCE_BERT_CONFIG = "sentence_bert_config.json"
POOLING_CONFIG = Path("1_Pooling") / "config.json"


@dataclass
class Objective:
    """What the bi-encoder is trained to do, and how the batch is pushed through it."""

    loss: str = "mnrl"  # mnrl (pairs/triplets, in-batch negatives) | cosent | cosine (scored pairs)
    scale: float = 20.0  # cosine multiplier of mnrl and cosent (1 / temperature)
    symmetric: bool = False  # mnrl: also each positive must pick its anchor
    matryoshka_dims: list[int] = field(default_factory=list)  # e.g. [384, 128, 64]: also train these prefixes
    mini_batch_size: int = 0  # > 0: gradient cache, the encoder sees this many texts at a time
    distillation: float = 0.0  # mnrl: weight of the KL to a teacher's in-batch scores (batches carry *_teacher)
    distill_documents: float = 0.0  # > 0: the teacher term also keeps positive-to-positive rankings, this weight
    distill_lexical: float = 0.0  # > 0: the teacher's anchor-to-positive scores fused with BM25's, this share

    def __post_init__(self) -> None:
        if self.loss not in LOSSES:
            raise ValueError(f"loss {self.loss!r} is not one of {', '.join(LOSSES)}")
        check_fields(self, "loss.")
        for dim in self.matryoshka_dims:
            checked("matryoshka_dims", dim, where="loss.")
        if self.distillation and self.loss != "mnrl":
            raise ValueError("loss.distillation is a weight of the mnrl loss's teacher term; leave it 0 with "
                             f"loss {self.loss}")
        if self.distill_documents and not self.distillation:
            raise ValueError("loss.distill_documents extends the teacher term; give loss.distillation a weight too")
        if self.distill_lexical and not self.distillation:
            raise ValueError("loss.distill_lexical extends the teacher term; give loss.distillation a weight too")
        if self.symmetric and self.loss != "mnrl":
            raise ValueError("loss.symmetric applies to mnrl only (in-batch negatives in both directions)")

    @property
    def needs_scores(self) -> bool:
        return self.loss != "mnrl"

    def loss_of(self, vectors: list[Tensor], scores: Tensor | None, teacher: list[Tensor] | None = None) -> Tensor:
        """vectors: [anchors, positives(, negatives)], each (batch, dim); scores (batch,) for scored pairs;
        teacher: a teacher's [anchors, positives] vectors when distillation > 0, and with distill_lexical the
        (anchors, positives) lexical scores third."""
        loss = self.task_loss(vectors, scores)
        if not self.distillation:
            return loss
        if teacher is None:
            raise ValueError("loss.distillation needs the teacher's vectors in the batch (anchor_teacher, "
                             "positive_teacher)")
        lexical = teacher[2] if len(teacher) > 2 else None
        if self.distill_lexical and lexical is None:
            raise ValueError("loss.distill_lexical needs the batch's lexical scores (lexical_teacher)")
        return loss + self.distillation * score_distillation_loss(*vectors[:2], *teacher[:2], scale=self.scale,
                                                                  symmetric=self.symmetric,
                                                                  documents=self.distill_documents,
                                                                  lexical=lexical, lexical_share=self.distill_lexical)

    def task_loss(self, vectors: list[Tensor], scores: Tensor | None) -> Tensor:
        if self.loss == "mnrl":
            function, arguments = multiple_negatives_ranking_loss, vectors
            options = {"scale": self.scale, "symmetric": self.symmetric}
        elif self.loss == "cosent":
            function, arguments, options = cosent_loss, [*vectors, scores], {"scale": self.scale}
        else:
            function, arguments, options = cosine_similarity_loss, [*vectors, scores], {}
        if self.matryoshka_dims:
            function = matryoshka(function, self.matryoshka_dims)
        return function(*arguments, **options)


@dataclass
class BiEncoderOutput:
    loss: Tensor


class BiEncoder(nn.Module):
    """BertModel (`bert`, HF names) + pooling (+ L2 normalisation) + a training objective.

    bert: the encoder; pooling: mean (over real tokens), cls, or any sentence-transformers mode
    (embeddings/pooling.py); normalize: unit vectors; max_seq_length: the tokens a text is truncated to (None:
    the position table's); prompts, default_prompt_name and do_lower_case: a sentence-transformers folder's
    (models/folder.py), which its vectors depend on. The saved folder tells sentence-transformers all of them.
    Raises ValueError for a max_seq_length past the position table.
    """

    def __init__(self, bert: BertModel, pooling: str = "mean", normalize: bool = False,
                 max_seq_length: int | None = None, objective: Objective | None = None,
                 prompts: dict[str, str] | None = None, default_prompt_name: str | None = None,
                 do_lower_case: bool = False):
        super().__init__()
        pooling_modes(pooling)  # ValueError naming the valid modes
        if max_seq_length:  # None or 0: the position table's size
            bert.config.checked_max_length(max_seq_length, name="max_seq_length")  # the one check of the table
        self.bert = bert
        if bert.pooler is not None:  # the sentence vector pools token states: no loss reaches the [CLS] pooler, so it
            bert.pooler.requires_grad_(False)  # stays as loaded, and DDP (torchrun) does not wait for its gradient
        self.pooling, self.normalize, self.max_seq_length = (pooling, normalize,
                                                             max_seq_length or bert.config.max_position_embeddings)
        self.prompts, self.default_prompt_name = dict(prompts or {}), default_prompt_name
        self.do_lower_case = do_lower_case
        self.objective = objective or Objective()
        width = bert.config.hidden_size * len(pooling_modes(pooling))  # "cls+mean" concatenates two
        too_wide = [d for d in self.objective.matryoshka_dims if d > width]
        if too_wide:
            raise ValueError(f"matryoshka_dims {too_wide} exceed the model's {width} dimensions; "
                             "use prefixes no longer than the vector")

    @property
    def config(self):
        return self.bert.config

    @property
    def default_prompt(self) -> str:
        return default_prompt(self.prompts, self.default_prompt_name)

    @property
    def several_backward_passes(self) -> bool:
        """True with the gradient cache, whose backward embeds each mini-batch again (the training loop reads it)."""
        return self.objective.mini_batch_size > 0

    def sentence_vectors(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """(batch, seq) ids and mask -> (batch, hidden) pooled vectors.

        On the CPU the encoder runs on the real tokens alone when enough of the batch is padding
        (`engine.unpadding`): a sentence-encoder batch pads short sentences and passages to the longest of
        each column, and without it half an ICT step's products were on padding (all-MiniLM-L6-v2, Python's
        FAQ, batch 32: 4,100 real tokens of 7,900). On a GPU it stays padded: building the packing there
        would read the mask back from the device every step.
        """
        packing = packing_if_it_pays(attention_mask, "cpu") if attention_mask.device.type == "cpu" else None
        states = self.bert(input_ids, attention_mask=attention_mask, packing=packing).last_hidden_state
        vectors = pool(states, attention_mask, self.pooling)
        return F.normalize(vectors, p=2, dim=-1) if self.normalize else vectors

    def forward(self, anchor_input_ids: Tensor, anchor_attention_mask: Tensor, positive_input_ids: Tensor,
                positive_attention_mask: Tensor, negative_input_ids: Tensor | None = None,
                negative_attention_mask: Tensor | None = None, scores: Tensor | None = None,
                anchor_teacher: Tensor | None = None, positive_teacher: Tensor | None = None,
                lexical_teacher: Tensor | None = None) -> BiEncoderOutput:
        """Tokenised columns (batch, seq) [negatives (batch * k, seq)], gold scores (batch,) and a teacher's
        vectors of anchors and positives (batch, dim) -> the loss."""
        columns = [(anchor_input_ids, anchor_attention_mask), (positive_input_ids, positive_attention_mask)]
        if negative_input_ids is not None:
            columns.append((negative_input_ids, negative_attention_mask))
        if self.objective.needs_scores and scores is None:
            raise ValueError(f"loss {self.objective.loss!r} needs gold scores: train it on scored pairs")

        teacher = None if anchor_teacher is None else [anchor_teacher, positive_teacher]
        if teacher is not None and lexical_teacher is not None:
            teacher.append(lexical_teacher)

        def loss_of(vectors: list[Tensor]) -> Tensor:
            return self.objective.loss_of(vectors, scores, teacher)

        if self.objective.mini_batch_size and torch.is_grad_enabled():
            return BiEncoderOutput(cached_loss(self.sentence_vectors, columns, loss_of,
                                               self.objective.mini_batch_size))
        return BiEncoderOutput(loss_of([self.sentence_vectors(ids, mask) for ids, mask in columns]))

    # ---- checkpoints: a sentence-transformers folder

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """Also takes the folder's own weights (BertModel names, no `bert.` prefix), as the loop's resume reads them."""
        if not any(key.startswith("bert.") for key in state_dict):
            return self.bert.load_state_dict(state_dict, strict=strict, assign=assign)
        return super().load_state_dict(state_dict, strict=strict, assign=assign)

    def save_pretrained(self, directory: str | os.PathLike, tokenizer=None) -> Path:
        """Write a sentence-transformers folder (see the module docstring): a new folder appears whole; into an
        existing one each file is replaced whole and the folder's other files (modules of its own) stay."""
        target = Path(directory)
        with published_folder(target, existing="merge") as folder:
            self.bert.save_pretrained(folder, tokenizer=tokenizer)
            write_json(folder / MODULES_FILE, modules(self.normalize))
            write_json(folder / SENTENCE_BERT_CONFIG, {"max_seq_length": self.max_seq_length,
                                                       "do_lower_case": self.do_lower_case})
            (folder / POOLING_CONFIG).parent.mkdir()
            write_json(folder / POOLING_CONFIG, pooling_config(self.pooling, self.config.hidden_size))
            write_json(folder / ST_CONFIG_FILE, {"__version__": package_versions(), "prompts": self.prompts,
                                                 "default_prompt_name": self.default_prompt_name,
                                                 "similarity_fn_name": "cosine"})
        return target

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike | ModelFolder, pooling: str | None = None,
                        normalize: bool | None = None, max_seq_length: int | None = None,
                        objective: Objective | None = None) -> "BiEncoder":
        """A sentence-transformers folder or any BERT checkpoint, read by `read_model_folder`: None options, the
        prompts and the lower-casing follow the folder (a plain checkpoint: mean, no normalisation, its tokenizer's
        limit within the positions). Raises ValueError for a folder whose modules bertforge does not reproduce."""
        folder = path if isinstance(path, ModelFolder) else read_model_folder(path)
        return cls(BertModel.from_pretrained(folder.transformer), pooling=pooling or folder.pooling,
                   normalize=folder.normalize if normalize is None else normalize,
                   max_seq_length=max_seq_length or folder.max_seq_length, objective=objective,
                   prompts=folder.prompts, default_prompt_name=folder.default_prompt_name,
                   do_lower_case=folder.do_lower_case)


def modules(normalize: bool) -> list[dict]:
    # The classic type names: every sentence-transformers release from 2.x on (6.x included) reads them.
    entries = [("", "sentence_transformers.models.Transformer"), ("1_Pooling", "sentence_transformers.models.Pooling")]
    if normalize:
        entries.append(("2_Normalize", "sentence_transformers.models.Normalize"))
    return [{"idx": i, "name": str(i), "path": path, "type": kind} for i, (path, kind) in enumerate(entries)]


def write_json(path: Path, value) -> None:
    path.write_text(json.dumps(value, indent=2) + "\n", encoding="utf-8")


def package_versions() -> dict[str, str]:
    """The versions sentence-transformers records in its config (its own, transformers', pytorch's), and bertforge's."""
    versions = {}
    for key, package in (("sentence_transformers", "sentence-transformers"), ("transformers", "transformers"),
                         ("pytorch", "torch"), ("bertforge", "bertforge")):
        try:
            versions[key] = metadata.version(package)
        except metadata.PackageNotFoundError:  # not installed here: the folder says nothing of it
            continue
    return versions
