"""The sentence-encoder recipe: pairs / triplets / scored pairs + any BERT checkpoint -> a sentence-transformers folder.

Everything but the data and the loss is the one training loop (`train.loop.train`), with
sentence-transformers' usual fine-tuning values: batch 32, lr 2e-5, 10% warm-up, 1 epoch.
Held-out data is evaluated every epoch (or every training.eval_every steps): a retrieval set
in BEIR layout (recall@1/10, MRR@10, nDCG@10) or a scored-pairs file (Spearman); with it,
the best model is kept in output_dir/best, else the last one is saved there.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ...embeddings.folder_vectors import with_prompt
from ...settings import CHECKPOINT, PATH, load_recipe, recipe_from_values
from ...train.config import FinetuningConfig
from ...train.runner import RecipeRun, run_recipe
from .bi_encoder import BiEncoder, Objective
from .evaluation import encoder_embedder, encoder_scorer, evaluate_retrieval, evaluate_scored_pairs
from .reader import SentencePairs, beir_qrels, read_pairs, read_retrieval_set

logger = logging.getLogger("bertforge")


def sbert_defaults() -> FinetuningConfig:
    return FinetuningConfig(output_dir="runs/sbert", eval_at_start=True)


@dataclass
class SbertData:
    train: str = field(default="", metadata=PATH)  # .csv/.tsv/.jsonl: anchor, positive[, negative] (mnrl) or sentence1, sentence2, score
    columns: list[str] = field(default_factory=list)  # the file's own names for those columns, in that order
    dev: str = field(default="", metadata=PATH)  # a BEIR folder (queries.jsonl, corpus.jsonl, qrels.tsv) or a scored-pairs file
    test: str = field(default="", metadata=PATH)  # the same kinds; scored once with the final model


@dataclass
class SbertRecipe:
    init_from: str = field(default="minilm", metadata=CHECKPOINT)  # any BERT checkpoint folder, a sentence-transformers folder, or a packaged name
    pooling: str = ""  # mean | cls; "": the folder's own (sentence-transformers), else mean
    normalize: bool | None = None  # L2-normalise the vectors; None: the folder's own, else no
    max_length: int = 0  # tokens per text; 0: the folder's max_seq_length (a plain checkpoint's: its tokenizer's limit)
    loss: Objective = field(default_factory=Objective)
    data: SbertData = field(default_factory=SbertData)
    epochs: float = 1.0
    batch_size: int = 32  # in-batch negatives: each anchor sees batch_size - 1 other positives
    eval_batch_size: int = 64
    training: FinetuningConfig = field(default_factory=sbert_defaults)  # max_steps/eval_every 0: from epochs

    @classmethod
    def from_file(cls, path: str | Path, overrides: list[str] = (), flags: dict | None = None) -> "SbertRecipe":
        """The recipe at `path`, then command-line flags ({"init_from": ...}), then key=value overrides."""
        return load_recipe(cls, path, flags, list(overrides))

    @classmethod
    def from_values(cls, values: dict, base: Path = Path(".")) -> "SbertRecipe":
        """A recipe from a (YAML-shaped) mapping; its relative paths are relative to `base`."""
        return recipe_from_values(cls, values, base)


def run_sbert_training(recipe: SbertRecipe, resume: bool = False, overwrite: bool = False) -> dict:
    """Train on data.train; evaluate on data.dev during training and on dev/test at the end.

    Returns {"dev": metrics, "test": metrics, ...}, also written to output_dir/results.json;
    the model (a sentence-transformers folder) is output_dir/best. The output folder follows
    `train.run_folder`: a new run, resume=True, or overwrite=True.
    Raises ValueError for missing or malformed data (see reader.read_pairs).
    """
    if not recipe.data.train:
        raise ValueError("the recipe has no training file: set data.train (CSV, TSV or JSONL of pairs, triplets or "
                         "scored pairs)")
    return run_recipe(recipe.training, lambda run: train_sbert_in(recipe, run), init_from=recipe.init_from,
                      resume=resume, overwrite=overwrite, command="bertforge sbert train", recipe=recipe)


def train_sbert_in(recipe: SbertRecipe, run: RecipeRun) -> dict:
    pairs = read_pairs(recipe.data.train, recipe.data.columns or None, scored=recipe.loss.needs_scores)
    held_out = {split: load_held_out(path, split) for split in ("dev", "test") if (path := getattr(recipe.data, split))}
    model = run.build(BiEncoder, pooling=recipe.pooling or None, normalize=recipe.normalize,
                      max_seq_length=recipe.max_length or None, objective=recipe.loss)
    collate = PairCollator(pairs, run.tokenizer, model.max_seq_length, prompt=model.default_prompt)
    batches = run.batches(len(pairs), recipe.batch_size, collate)
    default_metric = "spearman" if isinstance(held_out.get("dev"), SentencePairs) else "ndcg@10"
    config = run.schedule(batches, recipe.epochs, has_dev="dev" in held_out, default_metric=default_metric)
    logger.warning("training a %s-pooled bi-encoder from %s on %s: %d rows, loss %s, %d steps", model.pooling,
                   run.init_from, run.device, len(pairs), recipe.loss.loss, config.max_steps)
    evaluate = ((lambda m: evaluate_held_out(m, run.tokenizer, held_out["dev"], recipe.eval_batch_size))
                if "dev" in held_out else None)
    final = run.fit(model, batches, config, evaluate)
    results = {"init_from": run.init_from, "train_rows": len(pairs), "steps": config.max_steps,
               "loss": recipe.loss.loss}
    for split, data in held_out.items():
        results[split] = evaluate_held_out(final, run.tokenizer, data, recipe.eval_batch_size)
    return results


def load_held_out(path: str, split: str = "test"):
    """A BEIR folder (the split's qrels where `beir_qrels` finds them: qrels/SPLIT.tsv or qrels.tsv) -> RetrievalSet;
    a file -> scored pairs (sentence1, sentence2, score)."""
    folder = Path(path)
    if folder.is_dir():
        return read_retrieval_set(folder / "queries.jsonl", folder / "corpus.jsonl", beir_qrels(folder, split))
    return read_pairs(folder, scored=True, held_out=True)


def evaluate_held_out(model: BiEncoder, tokenizer, data, batch_size: int = 64) -> dict[str, float]:
    embedder = encoder_embedder(model, tokenizer, batch_size=batch_size)
    if isinstance(data, SentencePairs):
        return evaluate_scored_pairs(embedder, data)
    return evaluate_retrieval(encoder_scorer(embedder), data)


class PairCollator:
    """Rows -> the BiEncoder's forward arguments: each column tokenised and padded to its longest text.

    prompt: the model's default prompt (`BiEncoder.default_prompt`), put before every text of every column as
    `embed` and the evaluations put it (`with_prompt`, the prompt counted in max_length): the model trains on the
    ids it is scored and served on. "" (a folder without prompts): the texts as written.
    """

    def __init__(self, pairs: SentencePairs, tokenizer, max_length: int, prompt: str = ""):
        self.pairs, self.tokenizer, self.max_length, self.prompt = pairs, tokenizer, max_length, prompt

    def __call__(self, indices: list[int]) -> dict[str, torch.Tensor]:
        columns = {"anchor": self.pairs.anchors, "positive": self.pairs.positives}
        if self.pairs.negatives is not None:
            columns["negative"] = self.pairs.negatives
        batch = {}
        for name, texts in columns.items():
            encoded = self.tokenizer([with_prompt(self.prompt, texts[i]) for i in indices], truncation=True,
                                     max_length=self.max_length, padding=True, return_tensors="pt")
            batch[f"{name}_input_ids"], batch[f"{name}_attention_mask"] = encoded["input_ids"], encoded["attention_mask"]
        if self.pairs.scores is not None:
            batch["scores"] = torch.tensor([self.pairs.scores[i] for i in indices], dtype=torch.float32)
        return batch
