"""ClinicalBERT's 30-day readmission: chunk datasets -> a model per (kind, task, seed) -> admission scores.

Data comes from `readmission.prepare` (folders <task>/{train,val,test}.csv of 318-word chunks).
Three kinds of model, each scored per admission the same way (ClinicalBERT's
P = (Pmax + Pmean n/c) / (1 + n/c) over the admission's chunk probabilities):
- "bert": any BERT checkpoint fine-tuned on the chunks with the one training loop (the best
  epoch by validation AUROC kept); from a checkpoint continued-pretrained on the notes, this is
  the ClinicalBERT row of the table;
- "bow": bag-of-words logistic regression; "bilstm": a Bi-LSTM over word embeddings, trained by
  the same loop (the best epoch by validation AUROC kept in best/).
Validation is scored per admission as the test set is, for both kinds that pick an epoch
(`baselines.scored_admissions`), so `--best-metric` means one thing for every kind.
Each run writes results.json (test AUROC / AUPRC / RP80 and what produced them) and
scores.csv (one row per test admission) so that `report` can rebuild Table 4 and the curves.
"""
from __future__ import annotations

import csv
import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from ..atomic import replaced_file, write_text
from ..train.batches import predict_rows
from ..tasks.classification.reader import read_rows
from ..tasks.classification.windows import Windows, encode_windows
from ..models.heads import BertForSequenceClassification
from ..tasks import TaskSettings
from ..tasks.finetune import task_card
from ..tasks.long_documents import CLINICALBERT_C, SINGLE_LABEL, combine
from .baselines import admission_labels, scored_admissions
from .notes import MIN_TAIL_WORDS, admission_chunks, clean_text
from .settings import CHUNK_MAX_LENGTH, EVERY_KIND, SPLIT_FILES, ReadmissionRun
from ..models.config import BertConfig
from ..models.folder import read_model_folder
from ..resources import resolve_model
from ..tokenization.folder import load_tokenizer
from ..tokenization.tokenizer import BertTokenizer
from ..train.checkpointing import TRAINER_STATE, latest_checkpoint
from ..train.runner import RecipeRun, run_recipe

logger = logging.getLogger("bertforge")


@dataclass
class Chunks:
    """The chunks of one split: texts, labels (0/1) and the admission each belongs to."""

    texts: list[str]
    labels: np.ndarray
    admissions: np.ndarray

    @classmethod
    def read(cls, path: Path) -> "Chunks":
        rows = read_rows(path, text_columns=["TEXT"], label_column="Label", id_column="ID")
        labels = np.array([int(float(value)) for value in rows.labels])
        return cls([texts[0] for texts in rows.texts], labels, np.array([int(float(i)) for i in rows.ids]))

    def admission_labels(self) -> tuple[np.ndarray, np.ndarray]:
        """(admission ids sorted, their labels): every chunk carries its admission's label."""
        return admission_labels(self.admissions, self.labels)


def score_admissions(chunks: Chunks, chunk_probabilities: np.ndarray, c: float) -> dict:
    """Admission-level metrics and scores from chunk P(readmitted) (`baselines.scored_admissions`): the test
    split's, and the validation that picks every kind's best epoch."""
    return scored_admissions(chunks.admissions, chunks.labels, chunk_probabilities, c)


# ---------------------------------------------------------------- BERT

class BertChunkScorer:
    """A BertForSequenceClassification over chunks: one window per chunk (the first max_length pieces)."""

    def __init__(self, tokenizer: BertTokenizer, max_length: int, batch_size: int = 64):
        self.tokenizer, self.max_length, self.batch_size = tokenizer, max_length, batch_size

    def windows(self, texts: list[str], labels: np.ndarray | None = None) -> Windows:
        return encode_windows(self.tokenizer, [(text,) for text in texts], self.max_length, stride=0, max_windows=1,
                              labels=None if labels is None else torch.as_tensor(labels, dtype=torch.long))

    def probabilities(self, model, windows: Windows, device=torch.device("cpu")) -> np.ndarray:
        logits = np.stack(predict_rows(model, [len(ids) for ids in windows.input_ids], windows.collate,
                                       batch_size=self.batch_size, device=device))
        return torch.softmax(torch.from_numpy(logits), dim=-1)[:, 1].numpy()


def train_bert(run: ReadmissionRun, chunks: dict[str, Chunks], recipe_run: RecipeRun) -> np.ndarray:
    """Fine-tune on train chunks, keep the best epoch by validation AUROC; returns test chunk probabilities."""
    scorer = BertChunkScorer(recipe_run.tokenizer, run.max_length, run.eval_batch_size)
    train_windows = scorer.windows(chunks["train"].texts, chunks["train"].labels)
    val_windows = scorer.windows(chunks["val"].texts)
    model = recipe_run.build(BertForSequenceClassification, num_labels=2,
                             id2label={0: "not readmitted", 1: "readmitted"},
                             label2id={"not readmitted": 0, "readmitted": 1}, problem_type=SINGLE_LABEL)
    # How its chunks are read (the first max_length pieces, one window): `readmission evaluate` and `score`,
    # `predict` and `serve --classifier` read them so too.
    model.files_beside_weights = task_card("classification", recipe_run.init_from, TaskSettings(
        max_length=run.max_length, stride=0, max_windows=1, combine="clinical", combine_c=run.c))
    batches = recipe_run.batches(len(train_windows), run.batch_size, train_windows.collate, seed=run.seed)
    config = recipe_run.schedule(batches, run.epochs, has_dev=True, default_metric="auroc")

    def evaluate(network) -> dict[str, float]:
        probabilities = scorer.probabilities(network, val_windows, recipe_run.device)
        return score_admissions(chunks["val"], probabilities, run.c)["metrics"]

    best = recipe_run.fit(model, batches, config, evaluate)
    return scorer.probabilities(best, scorer.windows(chunks["test"].texts), recipe_run.device)


def trained_reading(folder: str, tokenizer: BertTokenizer | None = None) -> tuple[int, float]:
    """How a readmission model was trained to read an admission: the word pieces of a chunk and the combination's c
    (its task.json's max_length and combine_c; a folder without one, CHUNK_MAX_LENGTH within its own length and
    ClinicalBERT's c): `evaluate` and `score` read and combine chunks as training did (a model trained with --c 4
    was evaluated with 2: AUROC 0.625 against its run's 0.500). tokenizer: the model's, loaded already."""
    from ..tasks.finetune import TASK_FILE, prediction_task

    task, read = prediction_task(folder, tokenizer=tokenizer)
    if (read.transformer / TASK_FILE).is_file():
        return task.max_length, task.settings.combine_c
    return min(CHUNK_MAX_LENGTH, task.max_length), CLINICALBERT_C


def load_readmission_model(folder: str, device: torch.device) -> tuple[BertForSequenceClassification, BertTokenizer]:
    """A fine-tuned readmission classifier (folder or packaged short name) and its tokenizer, on `device`.

    Raises ValueError unless it is a 2-label BertForSequenceClassification: a model of another
    task (or a plain BertModel with a fresh head) would print scores that mean nothing.
    """
    from ..models.checkpoint import resolve_checkpoint
    from ..models.config import BertConfig
    from ..resources import resolve_model

    folder = resolve_checkpoint(resolve_model(folder))
    config = BertConfig.from_json_file(folder / "config.json")
    architecture = (config.architectures or ["BertModel"])[0]
    if architecture != "BertForSequenceClassification" or config.num_labels != 2:
        kind = f"{architecture} with {config.num_labels} labels" if architecture == "BertForSequenceClassification" \
            else architecture
        raise ValueError(f"{folder} holds a {kind}, not a readmission model; use the best/ folder of "
                         "`bertforge readmission train --kind bert` (a 2-label BertForSequenceClassification)")
    return (BertForSequenceClassification.from_pretrained(folder).to(device),
            load_tokenizer(read_model_folder(folder)))


# ---------------------------------------------------------------- the run

def run_readmission(run: ReadmissionRun, overwrite: bool = False) -> dict:
    """Train one model on one task with one seed; score the test admissions; write results.json and scores.csv.

    The output folder follows `train.run_folder`: it must not hold another run unless overwrite=True. A BERT run's
    --max-length is checked against the checkpoint's position table first, as finetune checks its data.max_length
    (past the table it failed at the first step, after the model had loaded and training had started).
    """
    if run.kind == "bert":
        folder = read_model_folder(resolve_model(run.init_from)).transformer
        BertConfig.from_json_file(folder / "config.json").checked_max_length(run.max_length, name="--max-length")
    return run_recipe(run.training_config(), lambda recipe_run: train_and_score(run, recipe_run),
                      init_from=run.init_from if run.kind == "bert" else None, overwrite=overwrite,
                      command="bertforge readmission train")


def train_and_score(run: ReadmissionRun, recipe_run: RecipeRun) -> dict:
    """The run's result (results.json); its test admissions' scores go to scores.csv beside it."""
    from .baselines import bag_of_words, chunk_probabilities

    chunks = {split: Chunks.read(run.split_file(split)) for split in SPLIT_FILES}
    for split, read in chunks.items():  # before any training: AUROC has no meaning, and the run would end unscored
        if len(np.unique(read.labels)) < 2:
            raise ValueError(f"{run.split_file(split)}: every admission of the {split} split has label "
                             f"{int(read.labels[0]) if len(read.labels) else 'none'}; AUROC needs both classes: "
                             "prepare more admissions, or prepare again with another --seed")
    logger.warning("readmission %s / %s / seed %d: %s", run.name, run.task, run.seed,
                   ", ".join(f"{split} {len(c.texts)} chunks of {len(np.unique(c.admissions))} admissions"
                             for split, c in chunks.items()))
    if run.kind == "bert":
        test_probabilities = train_bert(run, chunks, recipe_run)
    elif run.kind == "bow":
        model = bag_of_words(chunks["train"].texts, chunks["train"].labels, seed=run.seed)
        test_probabilities = chunk_probabilities(model, chunks["test"].texts, scoring_batch_size(run))
    else:
        test_probabilities = train_bilstm_run(run, chunks)
    scored = score_admissions(chunks["test"], test_probabilities, run.c)
    with replaced_file(Path(run.output) / "scores.csv") as temporary, \
            open(temporary, "w", encoding="utf-8", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["ID", "Label", "score"])
        writer.writerows(zip(scored["admissions"].tolist(), scored["labels"].tolist(), scored["scores"].tolist()))
    return {"model": run.name, "task": run.task, "seed": run.seed, **scored["metrics"],
            "test_admissions": int(len(scored["admissions"])), "test_positives": int(scored["labels"].sum()),
            "run": recorded_settings(run)}


def recorded_settings(run: ReadmissionRun) -> dict:
    """results.json's "run": the settings the run used. ReadmissionRun's defaults are BERT's, which a baseline
    never reads: bow records the settings every kind reads (with the batch size it scored chunks at), bilstm those
    and the loop's config as it trained (its last checkpoint's, lr 1e-3 and no warm-up where BERT's said 2e-5 and
    10%)."""
    settings = asdict(run)
    if run.kind == "bert":
        return settings
    recorded = {name: settings[name] for name in EVERY_KIND if name in settings}
    recorded["eval_batch_size"] = scoring_batch_size(run)
    checkpoint = latest_checkpoint(Path(run.output)) if run.kind == "bilstm" else None
    if checkpoint is not None:
        recorded["training"] = json.loads((checkpoint / TRAINER_STATE).read_text(encoding="utf-8"))["config"]
    return recorded


def train_bilstm_run(run: ReadmissionRun, chunks: dict[str, Chunks]) -> np.ndarray:
    """The Bi-LSTM with the original's settings but those the run gives (`ReadmissionRun.loop_settings`),
    picked on validation as BERT is; returns test chunk probabilities."""
    from .baselines import chunk_probabilities, train_bilstm

    # ReadmissionRun's defaults are BERT's: only what the user set replaces the Bi-LSTM's own values.
    given = run.given()
    sizes = {name: given[name] for name in ("epochs", "batch_size") if name in given}
    # The loop's run (metrics.jsonl, checkpoints, best/) goes into this run's folder.
    model, _ = train_bilstm(chunks["train"].texts, chunks["train"].labels, dev_texts=chunks["val"].texts,
                            dev_labels=chunks["val"].labels, dev_admissions=chunks["val"].admissions, c=run.c,
                            seed=run.seed, eval_batch_size=scoring_batch_size(run), training=run.loop_settings(),
                            output_dir=run.output, device=run.device, **sizes)
    return chunk_probabilities(model, chunks["test"].texts, scoring_batch_size(run))


def scoring_batch_size(run: ReadmissionRun) -> int:
    """Chunks per forward pass when a baseline scores chunks: --eval-batch-size when given, else the baselines'
    own (ReadmissionRun's default is sized for BERT)."""
    from .baselines import EVAL_BATCH_SIZE

    return run.given().get("eval_batch_size", EVAL_BATCH_SIZE)


# ---------------------------------------------------------------- inference on a new admission

@dataclass
class RiskTrace:
    """The risk after each note of an admission, and the chunk that drove the final score."""

    risks: list[float | None]  # after notes 1..k, in the order given; None while the notes so far make no chunk
    chunk_probabilities: list[float]  # of every chunk of the whole admission, in order
    top_chunk: str  # the chunk with the highest probability: the text to read first

    def lines(self, names: list[str]) -> list[str]:
        """What `readmission score` prints: the risk after each note (by its name), then the top chunk."""
        too_few = (f"no risk yet: the notes so far have at most {MIN_TAIL_WORDS} words after cleaning, "
                   f"and a chunk needs {MIN_TAIL_WORDS + 1}")
        lines = [f"after {name}: " + (too_few if risk is None else f"risk {risk:.3f}")
                 for name, risk in zip(names, self.risks)]
        return lines + [f"highest-scoring chunk ({max(self.chunk_probabilities):.3f}): {self.top_chunk[:400]}"]


def admission_risk(model, tokenizer: BertTokenizer, notes: list[str], c: float = CLINICALBERT_C,
                   max_length: int = CHUNK_MAX_LENGTH, device: torch.device = torch.device("cpu")) -> RiskTrace:
    """Score a new admission's notes as they arrive: after each note, the notes so far are chunked as `prepare`
    chunks an admission (`notes.admission_chunks`) and scored as `readmission evaluate` scores one (ClinicalBERT's
    combination, `long_documents.combine`), so the last risk is the one training and evaluation would give.

    A risk is None while the notes so far give no chunk. Raises ValueError when all of them together give none.
    """
    chunks_so_far = [admission_chunks(notes[:count]) for count in range(1, len(notes) + 1)]
    chunks = chunks_so_far[-1] if notes else []
    if not chunks:
        words = len(clean_text(" ".join(notes)).split())
        count = f"{words} words, fewer than the {MIN_TAIL_WORDS + 1} of the shortest chunk" if words else "no words"
        raise ValueError(f"the notes have {count} after cleaning; nothing to score")
    # The notes so far share the whole admission's chunks but for their last: each distinct chunk is scored once.
    texts = list(dict.fromkeys(chunk for prefix in chunks_so_far for chunk in prefix))
    scorer = BertChunkScorer(tokenizer, max_length)
    probability = dict(zip(texts, scorer.probabilities(model, scorer.windows(texts), device).tolist()))

    risks = [combine([probability[chunk] for chunk in prefix], "clinical", c) if prefix else None
             for prefix in chunks_so_far]
    probabilities = [probability[chunk] for chunk in chunks]
    return RiskTrace(risks, probabilities,
                     chunks[int(np.argmax(probabilities))])


# ---------------------------------------------------------------- Table 4

def readmission_results(runs: list[Path]) -> tuple[list[Path], list[dict]]:
    """The readmission runs' results.json files under `runs` and what they hold. A folder searched holds other
    commands' runs too (the README's `sbert train` writes runs/sbert-drug-reviews): theirs are left out, where one
    stopped the report with "results[2] lacks ['model', 'task', ...]", naming no file; a run folder named itself
    must be a readmission run. Raises ValueError naming the file, or when none is found."""
    found, results = [], []
    for run in runs:
        named = (run / "results.json").exists()
        for path in sorted([run / "results.json"] if named else run.rglob("results.json")):
            result = json.loads(path.read_text(encoding="utf-8"))
            if isinstance(result, dict) and {"model", "task", "seed"} <= result.keys() and path not in found:
                found.append(path)
                results.append(result)
            elif named:
                raise ValueError(f"{path} is not a readmission run's results (no model, task and seed); give the "
                                 "folders `bertforge readmission train` wrote, or the folder that holds them")
    if not found:
        raise ValueError(f"no results.json under {', '.join(map(str, runs))} (of a readmission run); run `bertforge "
                         "readmission train` first")
    return found, results


def write_report(runs: list[Path], output: Path) -> str:
    """Table 4 from every results.json under `runs` (markdown + CSV), and per task the ROC and PR
    curves of each model's first seed; returns the markdown."""
    from .report import TASK_TITLES, plot_curves, table4, table4_csv

    found, results = readmission_results(runs)
    output.mkdir(parents=True, exist_ok=True)
    markdown = table4(results)
    write_text(output / "table4.md", markdown + "\n")
    table4_csv(results, output / "table4.csv")
    for task in TASK_TITLES:
        curves = {}
        for path, result in sorted(zip(found, results), key=lambda pair: pair[1]["seed"]):
            if result["task"] == task and result["model"] not in curves:
                with open(path.parent / "scores.csv", encoding="utf-8") as file:
                    rows = list(csv.DictReader(file))
                curves[result["model"]] = (np.array([int(r["Label"]) for r in rows]),
                                           np.array([float(r["score"]) for r in rows]))
        if curves:
            plot_curves(curves, output / f"roc-{task}.png", output / f"pr-{task}.png",
                        f"Readmission, {TASK_TITLES[task].lower()}")
    return markdown
