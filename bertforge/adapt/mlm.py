"""Continued MLM pretraining on the corpus (the ClinicalBERT recipe), the stage before the sentence-encoder ones.

It runs when the base has an MLM head (BertForMaskedLM, BertForPreTraining) or `--mlm CHECKPOINT`
names one: that checkpoint is trained on the corpus by `bertforge pretrain`'s own recipe
(tasks/pretraining: the prepared corpus, the masker, the one loop), MLM only: RoBERTa's packing
of whole sentences up to 128 tokens, no next-sentence task (DAPT, Gururangan et al. 2020, drops it
too; the sentence encoder never uses the NSP head). With `--vocab new` the checkpoint's vocabulary
first grows by the corpus's own pieces (domain_vocabulary.py).

What it trains on: the indexed passages (held-out ones without their cut sentence), as ICT does, each a document
of its own (pretraining packs sentences within a document): its length is epochs of the instances the prepared
corpus gives (`sized_settings`), counted by the pretraining dataset that trains on them.
What it is measured on: the held-out ICT query sentences, which no stage trains on: masked-token
loss and accuracy before the first step and after the last, under the same masks. Its row in the
report is the MLM-trained encoder under the base's pooling, zero-shot on the ICT queries; the stages
after it train that encoder.
"""
from __future__ import annotations

import functools
import math
import shutil
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from ..atomic import published_folder, replaced_file
from ..errors import UsageError
from ..input_files import blank_line_blocks
from ..models.checkpoint import has_mlm_head
from ..models.folder import ModelFolder, read_model_folder
from ..resources import resolve_model
from ..tasks.pretraining.dataset import PretrainingConfig, PretrainingDataset
from ..tasks.pretraining.recipe import (DataSettings, ModelSettings, PretrainRecipe, load_or_train_tokenizer,
                                        run_pretraining, tokenized_corpus)
from ..tasks.retrieval.bi_encoder import BiEncoder
from ..tokenization.folder import load_tokenizer
from ..tokenization.tokenizer import BertTokenizer
from ..train.checkpointing import latest_checkpoint, list_checkpoints
from ..train.config import TrainConfig
from ..train.distributed import Topology, barrier
from ..train.optim import steps_for_epochs
from .budget import budgeted_steps, read_budget
from .domain_vocabulary import corpus_pieces, grow_checkpoint, vocabulary_change

VOCABS = ("base", "new")
TRAIN_TEXT, HELD_OUT_TEXT = "corpus.txt", "heldout.txt"  # a passage (a held-out sentence) per blank-line block


@dataclass
class MlmSettings:
    """The MLM stage's knobs (presets.mlm_settings gives the preset's). Its length: `steps` when given, else
    `epochs` of the prepared corpus's instances within [min_steps, max_steps] (`sized_settings`, which fills in
    `steps` before the stage trains; the stage's cache key hashes these settings before that)."""

    steps: int | None = None
    epochs: float = 1.0
    min_steps: int = 1
    max_steps: int | None = None  # None: no cap
    batch_size: int = 32
    learning_rate: float = 1e-4
    warmup: float = 0.06
    max_seq_length: int = 128
    mlm_probability: float = 0.15
    vocab: str = "base"  # base: the checkpoint's vocabulary; new: grown by the corpus's own pieces
    vocab_size: int = 8000  # new: size of the vocabulary learnt on the corpus (its pieces the base lacks are added)
    seed: int = 0

    def __post_init__(self) -> None:
        if self.vocab not in VOCABS:
            raise ValueError(f"vocab {self.vocab!r} is not one of {', '.join(VOCABS)}")

    def steps_for(self, instances: int) -> int:
        """The steps `epochs` of an epoch of `instances` (a process's) train, within [min_steps, max_steps]. An
        epoch is the loader's batches, its last one short (recipe.EndlessBatches): ceil(instances / batch_size); a
        fraction of epochs rounds up, by the loop's rule (`train.optim.steps_for_epochs`)."""
        steps = max(self.min_steps, steps_for_epochs(self.epochs, math.ceil(instances / self.batch_size)))
        return steps if self.max_steps is None else min(self.max_steps, steps)


# --mlm's value that skips continued MLM even for a base with an MLM head (a SPLADE or already domain-trained one).
MLM_OFF = "off"


def mlm_source(mlm: str | None, base: ModelFolder, vocab: str, vocab_size: int | None = None) -> Path | None:
    """The checkpoint continued MLM trains: --mlm's, else the base's when it has an MLM head; None: no MLM
    stage (also for --mlm off). Raises UsageError for an --mlm without an MLM head, --vocab new with
    nothing to train, or --vocab-size without --vocab new."""
    if vocab_size is not None and vocab != "new":
        raise UsageError("--vocab-size sizes the vocabulary that --vocab new learns on the corpus; add --vocab new "
                         "or leave --vocab-size out")
    if mlm == MLM_OFF:
        if vocab == "new":
            raise UsageError("--vocab new grows the vocabulary for continued MLM pretraining, which --mlm off "
                             "skips; leave one of them out")
        return None
    if mlm:
        folder = read_model_folder(resolve_model(mlm))
        if not has_mlm_head(folder.transformer):
            raise UsageError(f"--mlm {mlm}: its weights have no MLM head ({folder.architecture}); give a "
                             "BertForMaskedLM or BertForPreTraining checkpoint (bert-base-uncased, say), or leave "
                             "--mlm out")
        return folder.transformer
    if has_mlm_head(base.transformer):
        return base.transformer
    if vocab == "new":
        raise UsageError(f"--vocab new grows the vocabulary for continued MLM pretraining, but the base "
                         f"({base.architecture}) has no MLM head; give --mlm CHECKPOINT (a BERT with one) or "
                         "leave --vocab out")
    return None


def run_mlm_stage(run, stage, settings: MlmSettings, seconds: float | None = None) -> dict | None:
    """Continue pretraining run.mlm_source on the corpus (resuming after a kill); the stage's record, finished.

    run: the pipeline's Run; stage: its Stage (folder, model). seconds: what its training steps may take (None:
    settings.steps, however long): fewer steps when a step timed here says they would not fit
    (`budget.budgeted_steps`; the choice is kept in stage.folder for a resumed run). Leaves stage.model (a
    sentence-transformers folder: the MLM-trained encoder, the base's pooling) and stage.folder/mlm (the
    checkpoint with its head).
    """
    started, source = time.time(), run.options.mlm or run.options.base
    main = run.topology.is_main  # under torchrun rank 0 writes the inputs; every process pretrains
    init, vocabulary = pretraining_start(run.mlm_source, stage.folder, settings), None
    if main:
        write_texts(stage.folder, run.held_out)
        vocabulary = prepare_start(run.mlm_source, stage.folder, settings)
    barrier(run.topology)
    resume = latest_checkpoint(stage.run) is not None if stage.run.is_dir() else False
    if stage.run.is_dir() and not resume and main:
        shutil.rmtree(stage.run)  # killed before its first checkpoint: start it again
    barrier(run.topology)
    settings, instances = sized_settings(settings, init, stage.folder, run.options, run.topology, resume)
    if seconds is not None:
        timing = functools.partial(timing_steps, mlm_recipe(init, stage.folder, settings, run.options))
        settings = replace(settings, steps=budgeted_steps(stage.folder, settings.steps, seconds, resume, run.topology,
                                                          timing))
    print(f"stage {stage.name}: continued MLM pretraining of {source}, {settings.steps} steps "
          f"({epochs_of(settings.steps, instances, settings.batch_size):.3g} epochs of {instances:,} instances), batch "
          f"{settings.batch_size}, lr {settings.learning_rate}" + (", a domain vocabulary" if settings.vocab == "new"
                                                                    else ""), flush=True)
    records = run_pretraining(mlm_recipe(init, stage.folder, settings, run.options), resume=resume)
    if not main:
        return None
    encoder, tokenizer = keep_models(list_checkpoints(stage.run)[-1] / "model", stage, run)
    evaluator = run.evaluator.with_tokenizer(tokenizer)
    scored = evaluator.encoder(encoder.to(run.device))
    masked = masked_lm_change(records)
    print(f"stage {stage.name}: held-out masked-token accuracy {masked['before']['accuracy']:.4f} -> "
          f"{masked['after']['accuracy']:.4f}, loss {masked['before']['loss']:.3f} -> {masked['after']['loss']:.3f}")
    record = stage.finish({"name": stage.name, "key": stage.key, **scored, "steps": settings.steps,
                           "instances_per_epoch": instances,
                           "epochs": round(epochs_of(settings.steps, instances, settings.batch_size), 4),
                           "seconds": time.time() - started, "description": describe(settings, source),
                           "settings": asdict(settings), "masked_lm": masked, "vocabulary": vocabulary,
                           "budget": read_budget(stage.folder) if seconds is not None else None})
    shutil.rmtree(stage.run)  # checkpoints and the prepared corpus: only a killed stage needs them
    shutil.rmtree(stage.folder / "init", ignore_errors=True)
    for name in (TRAIN_TEXT, HELD_OUT_TEXT):
        (stage.folder / name).unlink()
    return record


def sized_settings(settings: MlmSettings, init: Path, folder: Path, options, topology: Topology, resume: bool
                   ) -> tuple[MlmSettings, int]:
    """(settings with their steps, the instances an epoch gives this process): the pretraining dataset's own count
    over the corpus prepared in folder/run (where run_pretraining then finds it, prepared once). An estimate from
    the corpus's words assumed every sequence a full 128 tokens, where a passage's last one is short: Emma's
    first 6,000 lines, planned as 5 epochs, trained 2.65. Every epoch's count differs a little (short_seq_prob
    draws shorter targets anew); the first's sizes the stage, the same again when a killed stage resumes."""
    recipe = mlm_recipe(init, folder, replace(settings, steps=settings.steps or 1), options)
    run_dir = Path(recipe.training.output_dir)
    tokenizer = load_or_train_tokenizer(recipe, run_dir, topology, resume)  # the checkpoint's vocabulary
    corpus = tokenized_corpus(recipe.data.train, tokenizer, run_dir / "data" / "train", recipe.data, topology, resume)
    # As pretrain_in builds it: under torchrun each process's share, so the steps make an epoch on any number of them
    instances = len(PretrainingDataset(corpus, recipe.data.instances, seed=recipe.training.seed, rank=topology.rank,
                                       world_size=topology.world_size))
    return (settings if settings.steps else replace(settings, steps=settings.steps_for(instances))), instances


def epochs_of(steps: int, instances: int, batch_size: int) -> float:
    """The epochs `steps` batches train, an epoch being ceil(instances / batch_size) of them."""
    return steps / max(1, math.ceil(instances / batch_size))


def keep_models(checkpoint: Path, stage, run) -> tuple[BiEncoder, BertTokenizer]:
    """stage.folder/mlm: a copy of the trained checkpoint (head included; a copy, so a kill now can still
    resume); stage.model: its encoder as a sentence-transformers folder pooled as the base pools."""
    trained = stage.folder / "mlm"
    with published_folder(trained, existing="replace") as copy:  # the stage's own folder
        shutil.copytree(checkpoint, copy, dirs_exist_ok=True)
    # The base's settings (pooling, normalisation, prompts, lower-casing) with the stage's weights and vocabulary.
    like_base = replace(read_model_folder(run.base_folder), transformer=trained)
    encoder = BiEncoder.from_pretrained(like_base, max_seq_length=run.max_seq_length)
    tokenizer = load_tokenizer(like_base)
    encoder.save_pretrained(stage.model, tokenizer=tokenizer)
    return encoder, tokenizer


def write_texts(folder: Path, held_out) -> None:
    """The pretraining inputs: the indexed passages, and the held-out query sentences (a document each).
    Written once: a resumed run's prepared corpus checks they are the files it was made from."""
    texts = {TRAIN_TEXT: held_out.texts(),
             HELD_OUT_TEXT: [query for queries in held_out.queries.values() for query, _ in queries]}
    for name, blocks in texts.items():
        if not (folder / name).is_file():
            with replaced_file(folder / name) as temporary, temporary.open("w", encoding="utf-8") as text:
                for number, block in enumerate(blocks):  # a block at a time: the corpus is not held in memory
                    text.write(("\n\n" if number else "") + block)
                text.write("\n")


def pretraining_start(source: Path, folder: Path, settings: MlmSettings) -> Path:
    """The checkpoint continued MLM pretrains: `source`, or (vocab new) folder/init, which `prepare_start` writes."""
    return source if settings.vocab == "base" else folder / "init"


def prepare_start(source: Path, folder: Path, settings: MlmSettings) -> dict | None:
    """With vocab new, write source grown by the corpus's pieces to folder/init (once) and return the vocabulary's
    change on the corpus; None for vocab base."""
    if settings.vocab == "base":
        return None
    init = pretraining_start(source, folder, settings)
    if not (init / "config.json").is_file():
        pieces = corpus_pieces(folder / TRAIN_TEXT, BertTokenizer.from_pretrained(source), settings.vocab_size)
        grow_checkpoint(source, init, pieces)
    change = vocabulary_change(blank_line_blocks(folder / TRAIN_TEXT), BertTokenizer.from_pretrained(source),
                               BertTokenizer.from_pretrained(init))
    before, after = change["before"], change["after"]
    print(f"domain vocabulary: {change['added']:,} pieces added ({before['vocab_size']:,} -> {after['vocab_size']:,});"
          f" word pieces per word {before['pieces_per_word']:.3f} -> {after['pieces_per_word']:.3f}, words split "
          f"{before['split_share']:.1%} -> {after['split_share']:.1%}", flush=True)
    return change


def mlm_recipe(init: Path, folder: Path, settings: MlmSettings, options) -> PretrainRecipe:
    """The pretraining recipe that MLM-trains the checkpoint at `init` on folder's texts, in folder/run, on
    options.device at options.precision (adapt's options).

    Evaluated on the held-out sentences before the first step and after the last; checkpoints four times
    (the last one is the model), so a kill loses at most a quarter of the stage.
    """
    held_out = sum(1 for block in (folder / HELD_OUT_TEXT).read_text(encoding="utf-8").split("\n\n") if block.strip())
    return PretrainRecipe(
        model=ModelSettings(init_from=str(init)),
        data=DataSettings(train=[str(folder / TRAIN_TEXT)], heldout=[str(folder / HELD_OUT_TEXT)],
                          instances=PretrainingConfig(max_seq_length=settings.max_seq_length, nsp=False,
                                                      mlm_probability=settings.mlm_probability),
                          eval_batches=-(-held_out // settings.batch_size)),  # every held-out sentence
        training=TrainConfig(output_dir=str(folder / "run"), max_steps=settings.steps,
                             learning_rate=settings.learning_rate, warmup=settings.warmup,
                             save_every=max(1, settings.steps // 4), keep_last=1, seed=settings.seed,
                             tensorboard=False, plot=False, eval_at_start=True, device=options.device,
                             precision=options.precision),
        batch_size=settings.batch_size)


def timing_steps(recipe: PretrainRecipe, steps: int, scratch: Path) -> None:
    """The recipe's first `steps` steps, in `scratch`, without its evaluations or checkpoints but the last: how
    the time budget measures a step of continued MLM."""
    training = replace(recipe.training, output_dir=str(scratch / "run"), max_steps=steps, save_every=0,
                       eval_at_start=False, log_every=steps)
    run_pretraining(replace(recipe, data=replace(recipe.data, heldout=[]), training=training))


def masked_lm_change(records: list[dict]) -> dict:
    """{"before", "after": {"loss", "accuracy"}}: the held-out evaluations at step 0 and at the last step."""
    evaluations = [r for r in records if "eval_mlm_loss" in r]
    first, last = evaluations[0], evaluations[-1]
    return {moment: {"loss": r["eval_mlm_loss"], "accuracy": r["eval_mlm_accuracy"], "step": r["step"]}
            for moment, r in (("before", first), ("after", last))}


def describe(settings: MlmSettings, source: str) -> str:
    vocabulary = ", vocabulary grown by the corpus's own pieces" if settings.vocab == "new" else ""
    return (f"continued MLM pretraining of {source} on the corpus (no NSP){vocabulary}, {settings.steps} steps, "
            f"batch {settings.batch_size}, lr {settings.learning_rate:g}; the encoder pooled as the base, zero-shot")
