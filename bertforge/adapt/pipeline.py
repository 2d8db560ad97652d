"""`bertforge adapt`: a folder of domain text -> a sentence encoder adapted to it, an index, and a report.

corpus -> held-out ICT queries -> baselines (BM25, the base model) -> continued MLM (given an MLM
head: mlm.py) -> generated queries (given a query generator: pseudo_queries.py) -> sentence-encoder
training stages (each stage cached, resumable) -> the stage best
on the dev queries (or the base, when none beats it) -> DIR/model (a sentence-transformers folder
with a model card) -> DIR/index -> DIR/report.*.
"""
from __future__ import annotations

import contextlib
import io
import logging
import shutil
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from ..errors import TrainingInterrupted, UsageError
from ..models.folder import read_model_folder
from ..resources import resolve_model
from ..search.encoder import model_fingerprint
from ..tokenization.folder import load_tokenizer
from ..tokenization.tokenizer import BertTokenizer
from ..tasks.retrieval.baselines import BM25_ANALYZER
from ..tasks.retrieval.bi_encoder import BiEncoder
from ..train.checkpointing import latest_checkpoint
from ..engine.devices import select_device
from ..train.distributed import Topology, barrier, process_group
from ..search.documents import Corpus, corpus_summary
from .evaluation import HYBRID_METRIC, Evaluator, read_beir_folder
from .corpus_checks import check_corpus, check_held_out, read_adapt_corpus
from .ict import HeldOut, held_out_queries, training_passages
from .budget import StageTime, mlm_seconds, read_budget, training_seconds
from .methods import MethodSettings, train_method
from .mlm import mlm_source, run_mlm_stage
from .outputs import build_corpus_index, require_index_library, write_model
from .presets import PRESETS, mlm_settings, query_count, scored_passages, stage_settings, with_lexical_teacher
from .pseudo_queries import (GENERATED_SHARE, QUERY_SHARE, QueryGenerator, QuerySettings, check_generator,
                             generate_queries, read_queries)
from .report import (build_report, engine, engine_name, metrics_table, passage_engine, report_rows, settings_of,
                     write_report)
from .stages import Stage, base_system, claim_output, remove_stale, stage_key
from .vocabulary import Fragmentation, fragmentation, fragmentation_table

logger = logging.getLogger("bertforge")
RESUME = "run the same command again to continue: adapt picks up its stages where they stopped"


@dataclass
class AdaptOptions:
    corpus: list[str]
    output: str
    base: str = "minilm"
    preset: str = "quick"
    eval: str | None = None
    text_column: str = "text"
    id_column: str | None = None  # a table's column of passage ids (a JSONL record's id is read anyway)
    seed: int = 0
    device: str = "auto"
    precision: str = "auto"  # training.precision of every training stage (train/config.py)
    mlm: str | None = None  # an MLM checkpoint to continue-pretrain and train the encoder from (mlm.py)
    vocab: str = "base"  # new: grow the MLM checkpoint's vocabulary by the corpus's own pieces
    vocab_size: int | None = None  # with vocab new: the vocabulary learnt on the corpus (None: MlmSettings')
    minutes: float | None = None  # the run's time budget, which sizes the training stages (None: the preset's)
    query_generator: str | None = None  # a doc2query model: its queries join ICT's anchors (pseudo_queries.py)


@dataclass
class Run:
    """What every step of a run needs: the options, the corpus, the queries, the scorer, the cache keys."""

    options: AdaptOptions
    output: Path
    corpus: Corpus
    held_out: HeldOut
    evaluator: Evaluator
    tokenizer: BertTokenizer
    base_folder: Path
    device: torch.device
    corpus_key: str
    base_key: str
    vocabulary: Fragmentation
    max_seq_length: int  # the base's: no stage trains on longer texts than it was made for
    architecture: str
    pooling: str  # the base's, which every stage keeps
    mlm_source: Path | None = None  # the checkpoint continued MLM trains; None: no MLM stage
    topology: Topology = Topology()  # under torchrun: this process's rank (train.distributed)


def run_adapt(options: AdaptOptions) -> dict:
    """Run (or resume) every stage; returns the report (also DIR/report.json). See the module docstring.

    Under torchrun every process runs it: the training stages data-parallel (the recipe runner, the pretraining
    recipe), and everything else (baselines, scoring, the stage records, model, index and report) on rank 0,
    the other processes waiting for it at each stage, printing nothing and returning {}.
    """
    if options.preset not in PRESETS:
        raise UsageError(f"--preset {options.preset!r} is not one of {', '.join(PRESETS)}")
    require_index_library()  # the last stage's: said before the training rather than after it
    with process_group(select_device(options.device)) as topology:
        quiet = contextlib.nullcontext() if topology.is_main else contextlib.redirect_stdout(io.StringIO())
        try:
            with quiet:  # rank 0 tells the story
                return adapt_in(options, topology)
        except TrainingInterrupted as stop:  # adapt has no --resume: running it again resumes
            raise TrainingInterrupted(stop.stopped, RESUME) from None


def adapt_in(options: AdaptOptions, topology: Topology) -> dict:
    started = time.time()
    run = open_run(options, topology)
    baseline = Stage.of(run.output, "baseline", run.corpus_key, run.base_key, run.evaluator.eval_key)
    systems = finished(run, baseline, lambda: baseline.finish({"systems": baseline_systems(run)}))
    systems = systems["systems"] if systems else []
    stages, key, init = [], stage_key(run.corpus_key, run.base_key), run.base_folder
    planned = planned_stages(run, baseline)
    # A budget given on the command line is part of what a stage trained (the preset's own is not: a cached stage
    # stays valid on a faster or slower machine)
    minutes = [options.minutes] if options.minutes is not None else []
    if run.mlm_source is not None:  # the stages after it train the MLM-trained encoder, with its vocabulary
        settings = mlm_settings(options.preset, options.vocab, options.seed, options.vocab_size)
        stage = Stage.of(run.output, "mlm", key, model_fingerprint(run.mlm_source)[:12], settings, *minutes)
        stages.append(stage)
        systems.append(scored_on_this_eval(run, stage, finished(run, stage, lambda: run_mlm_stage(
            run, stage, settings, mlm_seconds(run, systems, planned[0][1], started)))))
        key, init = stage.key, stage.model
        run = replace(run, evaluator=run.evaluator.with_tokenizer(load_tokenizer(read_model_folder(init))))
    generated, queries_record = None, None
    if options.query_generator is not None:  # ICT's stages train on the queries too: they stand on this stage
        query_settings = QuerySettings(seed=options.seed)
        stage = Stage.of(run.output, "queries", run.corpus_key, generator_key(options.query_generator),
                         query_settings, *minutes)
        stages.append(stage)
        seconds = query_seconds(run, systems, planned[0][1], started) if not stage.done else None
        queries_record = finished(run, stage, lambda: run_query_stage(run, stage, query_settings, seconds))
        generated, key = read_queries(stage.folder), stage_key(key, stage.key)  # every process trains on them
        planned = [(name, replace(s, generated_share=GENERATED_SHARE) if s.method == "ict" else s)
                   for name, s in planned]
    for position, (name, settings) in enumerate(planned):
        # Keyed by the metric picking its best checkpoint too: one killed while that was ndcg@10 cannot resume by it
        stage = Stage.of(run.output, name, key, settings, HYBRID_METRIC, *minutes)
        stages.append(stage)
        systems.append(scored_on_this_eval(run, stage, finished(run, stage, lambda: run_stage(
            run, stage, settings, init, training_seconds(run, systems, settings, started, len(planned) - position),
            generated))))
        key, init = stage.key, stage.model
    if not topology.is_main:
        return {}
    final = pick_final(systems)
    index_stage = index_stage_of(run, final)
    removed = remove_stale(run.output, [baseline, *stages, index_stage])
    if removed:
        print(f"removed stale stages (made for another corpus, base or settings): {', '.join(removed)}")
    report = build_report(run, systems, final, time.time() - started, queries_record)
    write_model(run, final, report)
    if not index_stage.done:
        print(f"indexing {len(run.corpus.passages):,} passages with the final model ({final['name']}): "
              f"{engine_name(final)}", flush=True)
        sentence_weight, dense_weight, neighbour_weight = settings_of(engine(final))
        build_corpus_index(run, dense_weight, sentence_weight, neighbour_weight)
        index_stage.finish({"model": final["name"]})
    report["seconds"] = round(time.time() - started, 1)
    write_report(run.output, report)
    print(metrics_table(report_rows(systems), report["final_engine"]))
    print(report["note"])
    print(f"model: {run.output / 'model'}   index: {run.output / 'index'}   report: {run.output / 'report.md'}")
    return report


def index_stage_of(run: Run, final: dict) -> Stage:
    """DIR/index's stage: keyed by the corpus, the final model and the engine's settings; an index made before
    sentences or neighbours were picked keeps its key (the settings that are 0 are left out of it)."""
    sentence_weight, dense_weight, neighbour_weight = settings_of(engine(final))
    extra = [sentence_weight, neighbour_weight] if neighbour_weight else [sentence_weight] if sentence_weight else []
    return Stage.of(run.output, "index", run.corpus_key, final.get("key", run.base_key), dense_weight, *extra)


def planned_stages(run: Run, baseline: Stage) -> list[tuple[str, MethodSettings]]:
    """The preset's training stages for this corpus, within the model's length, the distilled ones with the base's
    hybrid as their teacher (`with_lexical_teacher`). Every process reads the base's fusion weight from the
    baseline stage rank 0 recorded (its own list of systems is empty)."""
    options = run.options
    planned = [(name, replace(settings, max_length=min(settings.max_length, run.max_seq_length))) for name, settings
               in stage_settings(options.preset, len(training_passages(run.held_out.corpus)), options.seed)]
    return with_lexical_teacher(planned, passage_engine(base_system(baseline.done["systems"]))["dense_weight"])


def finished(run: Run, stage: Stage, make: Callable[[], dict | None]) -> dict | None:
    """The stage's record, cached or made now (`make`: every rank trains, rank 0 scores and records); None on the
    other ranks under torchrun. Every rank sees the same stages finished, and leaves once rank 0 has recorded it."""
    barrier(run.topology)
    record = stage.done or make()
    barrier(run.topology)
    return record if run.topology.is_main else None


def scored_on_this_eval(run: Run, stage: Stage, record: dict | None) -> dict | None:
    """A finished stage's record, scored again when it was scored on another --eval set or none, or by an older
    scoring rule (`evaluation.SCORING_RULE`): training does not read the set (the stage's key leaves it out), so a
    stage cached before --eval was added, or before the set's files changed, kept no or stale numbers for it in the
    report and the model card. None stays None (other ranks)."""
    if record is None or record.get("eval_key") == run.evaluator.eval_key:
        return record
    folder = read_model_folder(stage.model)
    print(f"stage {stage.name}: scoring its model on the evaluation sets given now", flush=True)
    evaluator = run.evaluator.with_tokenizer(load_tokenizer(folder))
    scored = evaluator.encoder(BiEncoder.from_pretrained(folder).to(run.device))
    return stage.finish({**record, **scored})  # its eval_key among them


def open_run(options: AdaptOptions, topology: Topology = Topology()) -> Run:
    """Read and check the corpus, claim the output folder (rank 0), draw the held-out queries, print the corpus."""
    base = read_model_folder(resolve_model(options.base))  # one line for a folder it cannot reproduce
    if base.pooling not in ("mean", "cls") or base.transformer != base.root:
        raise UsageError(f"--base {options.base}: adapt trains mean- or cls-pooled encoders stored at the folder's "
                         f"root; this one pools with {base.pooling} in {base.transformer}")
    base_folder = base.root
    mlm = mlm_source(options.mlm, base, options.vocab, options.vocab_size)
    if options.query_generator is not None:
        check_generator(options.query_generator)
    tokenizer = load_tokenizer(base)
    max_seq_length = min(base.max_seq_length, read_model_folder(mlm).max_seq_length) if mlm else base.max_seq_length
    corpus = read_adapt_corpus(options.corpus, tokenizer, max_seq_length, options.text_column, options.id_column)
    check_corpus(corpus, " ".join(options.corpus))
    rng = np.random.default_rng(options.seed)
    held_out = held_out_queries(corpus.passages, query_count(options.preset, len(corpus.passages)), rng,
                                max_scored=scored_passages(options.preset), follows=corpus.passages.follows)
    check_held_out(held_out, " ".join(options.corpus))  # before the output folder is claimed: nothing left there
    output = Path(options.output)
    if topology.is_main:
        claim_output(output, {"command": "adapt", "corpus": [str(Path(p).resolve()) for p in options.corpus],
                              "base": str(options.base), "preset": options.preset})
    vocabulary = print_corpus(corpus, tokenizer)
    beir = read_beir_folder(options.eval) if options.eval else None
    # BM25 scores every stage (the baseline, each stage's fused dev pick, mined negatives): a new analyzer reruns them
    # A sampled corpus's sample is part of what every row was scored on (a whole corpus's key stays as it was)
    sample = [held_out.scored] if held_out.scored is not None else []
    corpus_key = stage_key(corpus.passages.digest, options.seed, options.preset, BM25_ANALYZER, *sample)
    return Run(options, output, corpus, held_out, Evaluator(held_out, tokenizer, beir), tokenizer, base_folder,
               select_device(options.device), corpus_key, model_fingerprint(base_folder)[:12], vocabulary,
               max_seq_length, base.architecture, base.pooling, mlm, topology)


def print_corpus(corpus: Corpus, tokenizer) -> Fragmentation:
    print("\n".join(corpus_summary(corpus)))
    vocabulary = fragmentation((p.text for p in corpus.passages), tokenizer)
    print(fragmentation_table(vocabulary))
    return vocabulary


def baseline_systems(run: Run) -> list[dict]:
    """BM25 and the base model zero-shot on every evaluation set."""
    queries = sum(len(q) for q in run.held_out.queries.values())
    scored = len(run.held_out.scored_indices())
    sample = "" if scored == len(run.held_out.corpus) else " (their own and others drawn from the corpus)"
    print(f"scoring BM25 and the base model: {queries} held-out ICT queries over {scored:,} passages{sample}"
          + (f", and the --eval set's {len(run.evaluator.beir.queries)} queries" if run.evaluator.beir else ""),
          flush=True)
    started = time.time()
    bm25 = {"name": "bm25", "metrics": run.evaluator.everything(run.evaluator.lexical),
            "seconds": time.time() - started}
    started = time.time()
    model = BiEncoder.from_pretrained(run.base_folder).to(run.device)
    base = {"name": "base", **run.evaluator.encoder(model), "seconds": time.time() - started,
            "description": f"{run.options.base} zero-shot"}
    return [bm25, base]


def generator_key(name: str) -> str:
    """What identifies a query generator in the stage cache: a folder's weights, or a hub name as given."""
    return model_fingerprint(Path(name))[:12] if Path(name).is_dir() else name


def query_seconds(run: Run, systems: list[dict | None], first_stage: MethodSettings, started: float
                  ) -> float | None:
    """The seconds generation may take (None: no budget): QUERY_SHARE of what the training stages would have."""
    time_left = training_seconds(run, systems, first_stage, started, stages_left=1)
    return None if time_left is None else QUERY_SHARE * time_left.seconds


def run_query_stage(run: Run, stage: Stage, settings: QuerySettings, seconds: float | None) -> dict | None:
    """Generate queries for the training passages (rank 0; resumes its file after a kill); its record."""
    if not run.topology.is_main:
        return None
    started = time.time()
    passages = training_passages(run.held_out.corpus)
    print(f"stage queries: {settings.per_passage} per passage for {len(passages):,} passages with "
          f"{run.options.query_generator}", flush=True)
    generator = QueryGenerator(run.options.query_generator, run.device)
    generated = generate_queries(generator, run.held_out.texts(), passages, settings, stage.folder, seconds)
    return stage.finish({"name": stage.name, "generator": run.options.query_generator, "passages": len(generated),
                         "of": len(passages), "queries": sum(len(q) for q in generated.values()),
                         "seconds": time.time() - started, "settings": asdict(settings)})


def run_stage(run: Run, stage: Stage, settings: MethodSettings, init: Path, budget: StageTime | None = None,
              generated: dict[int, list[str]] | None = None) -> dict | None:
    """Train one stage from `init` (resuming its checkpoints after a kill), its steps and evaluations within
    `budget` when given (`budget.budgeted_stage_steps`), ICT's anchors partly `generated` queries when given; its
    record, finished."""
    started = time.time()
    print(f"stage {stage.name}: {settings.method}, {settings.epochs} epoch(s), batch {settings.batch_size}, "
          f"lr {settings.learning_rate}" + (", BM25 hard negatives" if settings.hard_negatives else ""), flush=True)
    resume = stage.run.is_dir() and latest_checkpoint(stage.run) is not None
    if stage.run.is_dir() and not resume and run.topology.is_main:
        shutil.rmtree(stage.run)  # killed before its first checkpoint: start it again
    best_model, records = train_method(init, run.held_out.corpus, run.held_out.texts(), settings, stage.run,
                                       run.evaluator.during_training, run.options.device, resume=resume,
                                       precision=run.options.precision, budget=budget, generated=generated,
                                       best_metric=HYBRID_METRIC)
    if best_model is None:  # another process under torchrun: rank 0 scores and records the stage
        return None
    budget = read_budget(stage.run)
    evaluations = [r for r in records if f"eval_{HYBRID_METRIC}" in r]
    best = max(evaluations, key=lambda r: r[f"eval_{HYBRID_METRIC}"])  # the first of equals, as the loop keeps it
    shutil.rmtree(stage.model, ignore_errors=True)
    (stage.run / "best").rename(stage.model)
    scored = run.evaluator.encoder(best_model.to(run.device))  # alone and fused with BM25, every set
    shutil.rmtree(stage.run)  # checkpoints: only a killed stage needs them
    steps = evaluations[-1]["step"]
    return stage.finish({"name": stage.name, "key": stage.key, **scored, "best_step": best["step"],
                         "best_metric": HYBRID_METRIC, "steps": steps, "seconds": time.time() - started,
                         "steps_per_second": steps / max(1e-9, time.time() - started),
                         "description": describe(settings, budget),
                         "settings": asdict(settings), "budget": budget,
                         "evaluations": [evaluation_record(r) for r in evaluations]})


def evaluation_record(record: dict) -> dict:
    """One evaluation during training, as the report keeps it: fused with BM25 (hybrid_, what picked the
    checkpoint) and the model alone (ndcg@10, as retrieval_metrics and `sbert train` mean it), on the dev and test
    queries."""
    return {"step": record["step"], "hybrid_dev_ndcg@10": record[f"eval_{HYBRID_METRIC}"],
            "hybrid_test_ndcg@10": record.get("eval_hybrid_test_ndcg@10"),
            "dev_ndcg@10": record.get("eval_ndcg@10"), "test_ndcg@10": record.get("eval_test_ndcg@10")}


def length(settings: MethodSettings, budget: dict | None) -> str:
    """How long the stage trained: the preset's epochs, or the steps a time budget chose (BUDGET_FILE; one
    written before steps were kept holds its epochs only)."""
    if budget is None:
        return f"{settings.epochs} epoch(s)"
    if "steps" not in budget:
        return f"{budget['epochs']} epoch(s)"
    if budget["steps"] == budget["steps_without_budget"]:
        return f"{settings.epochs} epoch(s)"
    return f"{budget['steps']} steps ({budget['epochs']:g} epoch(s), the time budget's)"


def describe(settings: MethodSettings, budget: dict | None = None) -> str:
    if settings.method == "simcse":
        return f"SimCSE (a passage and itself under two dropout masks), {length(settings, budget)}"
    if settings.method == "tsdae":
        return (f"TSDAE (each sentence rebuilt from the vector of its words after deleting 60%), batch "
                f"{settings.batch_size}, lr {settings.learning_rate:g}, {length(settings, budget)}")
    negatives = " + a BM25-mined hard negative" if settings.hard_negatives else ""
    queries = (f"; {settings.generated_share:.0%} of the anchors of passages with generated queries are one of them "
               "(against the whole passage)" if settings.generated_share else "")
    hybrid = f" fused with BM25's at {settings.distill_lexical:g}" if settings.distill_lexical else ""
    parts = [f"sentences over passages{hybrid}"] if settings.distill_documents or hybrid else []
    if settings.distill_documents:
        parts.append(f"{settings.distill_documents:g} x passages over passages")
    rankings = "in-batch rankings" + (f" ({', and '.join(parts)})" if parts else "")
    distilled = (f", + {settings.distillation:g} x KL to the starting model's {rankings}"
                 if settings.distillation else "")
    return (f"ICT (a sentence vs its passage without it, kept {settings.keep_probability:.0%}), in-batch "
            f"negatives{negatives}{queries}, {'symmetric ' if settings.symmetric else ''}MNRL scale {settings.scale:g}"
            f"{distilled}, batch {settings.batch_size}, lr {settings.learning_rate:g}, {length(settings, budget)}")


def pick_final(systems: list[dict]) -> dict:
    """The trained stage whose engine (the model fused with BM25 at its dev-picked weight, which may be 1: the
    model alone) has the best dev nDCG@10, if it beats the base model's engine; else the base."""
    def dev(system: dict) -> float:
        return engine(system)["metrics"]["dev"]["ndcg@10"]

    base = base_system(systems)
    trained = [s for s in systems if s["name"] not in ("bm25", "base")]
    best = max(trained, key=dev, default=None)
    return base if best is None or dev(best) <= dev(base) else best
