"""Unsupervised sentence-encoder training on the corpus alone, on the one loop (`train.loop.train`).

- ICT (Lee et al. 2019): a sentence and the passage it came from (without it, mostly) are a
  pair; the other passages of the batch, and a BM25-mined hard negative, are the negatives.
  Multiple-negatives ranking loss, symmetric: the passage must also pick its sentence.
- SimCSE (Gao et al. 2021): a text and itself, encoded twice with dropout on, are a pair;
  the batch's other texts are the negatives. Keeps the vector space from collapsing onto
  whatever ICT rewards; cheap (short texts, no mining).
- TSDAE (Wang et al. 2021): each sentence of the corpus loses 60% of its words; a decoder tied to
  the encoder must write it back from the encoder's vector of what is left
  (`tasks.retrieval.denoising`). No pairs, no negatives: learns what the domain's sentences say.

Each method trains the model in place and keeps the best model on the dev ICT queries in
run_dir/best (the loop's best-model tracking, by the metric train_method is given: ndcg@10, the model alone, as
`sbert train` keeps it; adapt's pipeline gives hybrid_ndcg@10, the model fused with BM25 as its index ranks).
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..embeddings.folder_vectors import with_prompt
from ..engine.threads import torch_threads
from ..models.model import set_attention_dropout
from ..tasks.retrieval.baselines import Bm25Statistics
from ..tasks.retrieval.bi_encoder import BiEncoder, Objective
from ..tasks.retrieval.denoising import DenoisingAutoEncoder, DenoisingCollator
from ..train.best import best_model_folder
from ..train.config import FinetuningConfig
from ..train.run_log import METRICS_FILE
from ..train.runner import RecipeRun, run_recipe
from .budget import StageTime, budgeted_stage_steps, evaluation_interval
from ..search.documents import Passage
from .ict import MIN_QUERY_WORDS, IctCollator, training_passages
from .mining import bm25_negatives

logger = logging.getLogger("bertforge")
METHODS = ("ict", "simcse", "tsdae")


@dataclass
class MethodSettings:
    """One training stage's knobs; the defaults are what the quick preset measured best (README)."""

    method: str = "ict"
    epochs: float = 3.0
    batch_size: int = 32
    learning_rate: float = 5e-5
    warmup: float = 0.1
    scale: float = 20.0
    symmetric: bool = True
    hard_negatives: bool = True
    keep_probability: float = 0.1
    max_length: int = 256  # passage tokens (queries: query_max_length)
    query_max_length: int = 64
    mini_batch_size: int = 0  # > 0: gradient cache (bigger batches at the memory of this many texts)
    evaluations_per_epoch: int = 1
    distillation: float = 0.0  # > 0: also keep the starting model's in-batch rankings (KL weight)
    distill_documents: float = 0.0  # > 0: the teacher term also keeps the passages' rankings among themselves
    distill_lexical: float = 0.0  # > 0: BM25's share in the teacher's sentence-to-passage scores (a hybrid teacher)
    attention_dropout: float | None = None  # dropout on the attention probabilities while training; None: the model's
    generated_share: float = 0.0  # ICT: share of the anchors that are generated queries, where a passage has some
    seed: int = 0

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"method {self.method!r} is not one of {', '.join(METHODS)}")
        if self.attention_dropout is not None and not 0.0 <= self.attention_dropout < 1.0:
            raise ValueError(f"attention_dropout must be in [0, 1), got {self.attention_dropout}")
        if not 0.0 <= self.generated_share <= 1.0:
            raise ValueError(f"generated_share must be in [0, 1], got {self.generated_share}")
        if self.method == "tsdae" and self.distillation:
            raise ValueError("distillation keeps in-batch rankings of pairs; TSDAE trains on single texts")


def train_method(init: Path, corpus: Sequence[Passage], texts: Sequence[str], settings: MethodSettings, run_dir: Path,
                 evaluate: Callable[[BiEncoder], dict[str, float]], device: str = "auto", resume: bool = False,
                 precision: str = "auto", budget: StageTime | None = None,
                 generated: dict[int, list[str]] | None = None, best_metric: str = "ndcg@10"
                 ) -> tuple[BiEncoder | None, list[dict]]:
    """Train the encoder at `init` with settings.method on the corpus, with the recipe runner (the one loop).

    corpus / texts: the passages as indexed (held-out ones without their cut sentence).
    generated: {corpus index: generated queries} (pseudo_queries.py), anchors for ICT's settings.generated_share.
    budget: the time the training steps and their evaluations may take (None: settings.epochs, however long):
    fewer steps when a step measured here (`budget.budgeted_stage_steps`) says settings.epochs would take longer,
    trained as the schedule's max_steps; the choice is kept in run_dir/budget.BUDGET_FILE, so a resumed run trains
    the same schedule. Evaluations (and checkpoints) come every settings.evaluations_per_epoch of an epoch and at
    the end, as the budget charged them.
    best_metric: what `evaluate` returns that picks run_dir/best (the loop logs it as eval_<best_metric>).
    Returns the best model on the dev queries (loaded from run_dir/best) and the loop's records,
    evaluations included (from run_dir's metrics log, so those before a kill count too); (None, []) on the
    other processes under torchrun.
    """
    config = FinetuningConfig(output_dir=str(run_dir), learning_rate=settings.learning_rate, warmup=settings.warmup,
                              seed=settings.seed, tensorboard=False, plot=False, device=device, precision=precision)

    def body(run: RecipeRun) -> dict:
        objective = Objective(loss="mnrl", scale=settings.scale, symmetric=settings.symmetric,
                              mini_batch_size=settings.mini_batch_size, distillation=settings.distillation,
                              distill_documents=settings.distill_documents,
                              distill_lexical=settings.distill_lexical)
        model = run.build(model_class(settings.method), max_seq_length=settings.max_length, objective=objective)
        if settings.attention_dropout is not None:
            set_attention_dropout(model, settings.attention_dropout)
        # Every text trained on gets the prompt every score and index puts before it (the model's default one)
        collate = make_collator(settings, corpus, texts, run.tokenizer, generated, model.default_prompt)
        if settings.distillation:
            # The starting model, frozen, before its copy trains: the same weights without reading `init` again.
            collate = TeacherVectors(collate, copy.deepcopy(model).to(run.device))
        fresh_batches = functools.partial(run.batches, len(collate), settings.batch_size, collate, seed=settings.seed)
        batches = fresh_batches()
        schedule = run.schedule(batches, settings.epochs, has_dev=True, default_metric=best_metric)
        if budget is not None:  # the budget's steps, exactly: not rounded through epochs and back
            schedule = dataclasses.replace(schedule, max_steps=budgeted_stage_steps(
                run, model, fresh_batches, settings.epochs, budget, settings.evaluations_per_epoch))
        every = evaluation_interval(batches.batches_per_epoch, settings.evaluations_per_epoch)
        schedule = dataclasses.replace(schedule, eval_every=every, save_every=every)
        logger.info("%s: %d examples, batch %d, %d steps", settings.method, len(collate), settings.batch_size,
                    schedule.max_steps)
        run.fit(model, batches, schedule, evaluate=evaluate)
        return {"steps": schedule.max_steps}

    if not run_recipe(config, body, init_from=str(init), resume=resume, command="bertforge adapt"):
        return None, []  # another process under torchrun (train/runner.py): rank 0 has the model
    best = BiEncoder.from_pretrained(best_model_folder(run_dir))
    return best, read_records(run_dir)


def read_records(run_dir: Path) -> list[dict]:
    path = run_dir / METRICS_FILE
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def model_class(method: str) -> type[BiEncoder]:
    """TSDAE trains a bi-encoder with a decoder tied to it (no use for the objective); the others, the bi-encoder."""
    return DenoisingAutoEncoder if method == "tsdae" else BiEncoder


def make_collator(settings: MethodSettings, corpus: Sequence[Passage], texts: Sequence[str], tokenizer,
                  generated: dict[int, list[str]] | None = None, prompt: str = ""):
    """settings.method's collator; prompt: the model's default prompt, before every text it encodes."""
    if settings.method == "simcse":
        return SimcseCollator(texts, tokenizer, settings.max_length, prompt=prompt)
    if settings.method == "tsdae":
        return DenoisingCollator(tsdae_sentences(corpus), tokenizer, settings.max_length, seed=settings.seed,
                                 prompt=prompt)
    examples = training_passages(corpus)
    if not examples:
        raise ValueError("no passage has two sentences to cut a query from: ICT needs text with sentence "
                         "boundaries (full stops); give prose, not lists of words")
    negatives = None
    if settings.hard_negatives and len(texts) > 1:
        negatives = bm25_negatives(corpus, texts, examples, np.random.default_rng(settings.seed))
    lexical = Bm25Statistics(texts) if settings.distill_lexical else None
    return IctCollator(corpus, examples, tokenizer, settings.max_length, settings.query_max_length,
                       seed=settings.seed, negatives=negatives, keep_probability=settings.keep_probability,
                       generated=generated, generated_share=settings.generated_share, lexical=lexical,
                       prompt=prompt)


def tsdae_sentences(corpus: Sequence[Passage]) -> list[str]:
    """TSDAE's texts: the corpus's sentences (the paper trains on sentences; a whole passage is more than one
    vector can spell back), those too short to be a query left out, as the held-out ones are."""
    sentences = [s for passage in corpus for s in passage.sentences if len(s.split()) >= MIN_QUERY_WORDS]
    if not sentences:
        raise ValueError(f"no sentence of at least {MIN_QUERY_WORDS} words to train TSDAE on; give prose")
    return sentences


class TeacherVectors:
    """A collator whose batches also carry a frozen teacher's vectors of their anchors and positives."""

    def __init__(self, collate, teacher: BiEncoder):
        self.collate, self.teacher = collate, teacher.eval().requires_grad_(False)

    def __len__(self) -> int:
        return len(self.collate)

    def __call__(self, indices: list[int]) -> dict[str, torch.Tensor]:
        batch = self.collate(indices)
        device = next(self.teacher.parameters()).device
        # On a CPU this runs in the loop's prefetch thread, beside the training step: on every core as well, the two
        # thread teams oversubscribed them and the time budget's timed steps came out short of the run's (Python's
        # FAQ, 2 cores: 5.0 s timed, 5.7 run; Python's docs 3.0 and 3.9); on one thread the timing held (5.8 and
        # 5.9) at the same speed within the noise
        with torch_threads(1) if device.type == "cpu" else contextlib.nullcontext():
            for column in ("anchor", "positive"):
                ids, mask = batch[f"{column}_input_ids"].to(device), batch[f"{column}_attention_mask"].to(device)
                with torch.no_grad():  # not inference_mode: the batch's tensors must stay usable by autograd
                    batch[f"{column}_teacher"] = self.teacher.sentence_vectors(ids, mask).float().cpu()
        return batch


class SimcseCollator:
    """Texts -> (text, the same text) pairs: the two dropout masks of the two encodings are the noise.

    prompt: the model's default prompt, before each text (`with_prompt`, counted in max_length) as `embed` puts it.
    """

    def __init__(self, texts: Sequence[str], tokenizer, max_length: int, prompt: str = ""):
        self.texts, self.tokenizer, self.max_length, self.prompt = texts, tokenizer, max_length, prompt

    def __len__(self) -> int:
        return len(self.texts)

    def __call__(self, indices: list[int]) -> dict[str, torch.Tensor]:
        encoded = self.tokenizer([with_prompt(self.prompt, self.texts[i]) for i in indices], truncation=True,
                                 max_length=self.max_length, padding=True, return_tensors="pt")
        ids, mask = encoded["input_ids"], encoded["attention_mask"]
        return {"anchor_input_ids": ids, "anchor_attention_mask": mask,
                "positive_input_ids": ids.clone(), "positive_attention_mask": mask.clone()}


def with_settings(settings: MethodSettings, **changes) -> MethodSettings:
    return dataclasses.replace(settings, **changes)
