"""Pretraining recipe: text files -> vocabulary -> prepared corpus -> BertForPreTraining.

From scratch (a preset and a vocabulary trained on the corpus) or continued from a
checkpoint (its weights and vocabulary; heads reused when present), on one process or
under torchrun. The training itself is `train.loop.train`.
"""
from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from ...models.config import CONFIG_NAME, BertConfig
from .dataset import PretrainingConfig, PretrainingDataset
from ...atomic import published_folder, write_text
from ...errors import BertforgeError, UsageError
from ...input_files import changed_inputs, fingerprints
from ...train.run_folder import claim_run_folder
from .corpus import TEXT_RULE, DocumentBoundary, expand_paths
from .shards import TokenizedCorpus, prepare_corpus, vocab_fingerprint
from ...models.heads import IGNORE_INDEX, BertForPreTraining, masked_positions_from, padded_masked_positions
from ...embeddings.vocabulary import load_vocabulary
from ...tokenization.tokenizer import BertTokenizer
from ...tokenization.vocab_training import reading_settings
from ...engine.devices import select_device, to_device
from ...train.distributed import Topology, barrier, process_group
from ...train.config import TrainConfig
from ...train.cuda_graph_step import graphs_apply
from ...train.loop import train
from ...train.resume import START_OVER, run_inputs, setting_changes
from ...settings import CHECKPOINT, KEYS_OF, PATH, load_recipe
from ...validation import STEPS_TO_RUN, check_bound, check_fields

logger = logging.getLogger("bertforge")
TRAINED_ON = "trained_on.json"  # beside a vocabulary a run trained: its files and settings


@dataclass
class ModelSettings:
    preset: str = "mini"  # used when init_from is empty
    init_from: str | None = field(default=None, metadata=CHECKPOINT)  # a checkpoint to continue from (domain adaptation)
    overrides: dict[str, Any] = field(default_factory=dict, metadata={KEYS_OF: BertConfig})  # e.g. hidden_dropout_prob


@dataclass
class TokenizerSettings:
    vocab: str | None = field(default=None, metadata=CHECKPOINT)  # an existing vocabulary (folder, vocab.txt, ...)
    vocab_size: int = 8000  # when training a new one on the training files
    min_frequency: int = 2
    lowercase: bool = True


@dataclass
class DataSettings:
    train: list[str] = field(default_factory=list, metadata=PATH)
    heldout: list[str] = field(default_factory=list, metadata=PATH)
    document_boundary: DocumentBoundary = "blank_line"
    text_field: str = "text"
    instances: PretrainingConfig = field(default_factory=PretrainingConfig)
    eval_batches: int = 50  # held-out batches per evaluation (fixed instances, so evaluations compare)


@dataclass
class PretrainRecipe:
    model: ModelSettings = field(default_factory=ModelSettings)
    tokenizer: TokenizerSettings = field(default_factory=TokenizerSettings)
    data: DataSettings = field(default_factory=DataSettings)
    training: TrainConfig = field(default_factory=TrainConfig)
    batch_size: int = 32  # per process and micro-step
    masked_only_head: bool = True  # run the MLM head on masked positions only (same loss, less compute)

    def __post_init__(self) -> None:
        check_fields(self, "recipe.")
        check_fields(self.tokenizer, "recipe.tokenizer.")
        check_fields(self.data, "recipe.data.")
        check_bound(STEPS_TO_RUN, "max_steps", self.training.max_steps, "recipe.training.")  # no epochs here

    @classmethod
    def from_file(cls, path: str | Path, overrides: list[str] = (), flags: dict | None = None) -> "PretrainRecipe":
        """The recipe at `path`, then command-line flags ({"model.init_from": ...}), then key=value overrides."""
        return load_recipe(cls, path, flags, list(overrides))


def load_or_train_tokenizer(recipe: PretrainRecipe, run_dir: Path, topology: Topology,
                            resume: bool = False) -> BertTokenizer:
    """The checkpoint's vocabulary, a given one, or (from scratch) one trained on the training files.

    A vocabulary trained by an earlier run in run_dir is reused when it was trained on the same
    files with the same settings (the tokenizer section and data.text_field); otherwise a new run
    trains it again and a resumed one stops. A `tokenizer` folder there that no run trained (no
    TRAINED_ON record) is the user's: a new run stops rather than replace it.
    """
    settings = recipe.tokenizer
    if recipe.model.init_from and settings.vocab:
        return checkpoint_vocabulary(recipe.model.init_from, settings.vocab)
    source = recipe.model.init_from or settings.vocab
    if source:
        return load_vocabulary(source)
    trained, record = run_dir / "tokenizer", run_dir / "tokenizer" / TRAINED_ON
    wanted = {**asdict(settings), "text_field": recipe.data.text_field, "text_rule": TEXT_RULE}
    if topology.is_main:
        files = expand_paths(recipe.data.train)
        change = "not trained yet"
        if trained.exists() and not record.exists() and not resume:  # replacing it would delete a user's folder
            raise BertforgeError(f"{trained} holds files this command did not write (no {TRAINED_ON}): to pretrain "
                                 f"with its vocabulary give tokenizer.vocab={trained}; to train one, move that folder "
                                 "out of the output folder")
        if (trained / "vocab.txt").exists():
            recorded = json.loads(record.read_text(encoding="utf-8")) if record.exists() else {}
            change = cache_change({"text_rule": 1, **recorded.get("settings", {})}, recorded.get("source_files"),
                                  files, wanted)
            if change:
                change = stale_cache(trained, change, resume, recorded=record.exists())
        if change:
            with published_folder(trained, existing="replace") as staging:  # the run's own cache
                BertTokenizer.train(files, vocab_size=settings.vocab_size, min_frequency=settings.min_frequency,
                                    lowercase=settings.lowercase,
                                    text_field=recipe.data.text_field).save_pretrained(staging)
                write_text(staging / TRAINED_ON, json.dumps(
                    {"settings": wanted, "source_files": fingerprints(files)}, indent=2) + "\n")
    barrier(topology)
    return BertTokenizer.from_pretrained(trained)


def checkpoint_vocabulary(init_from: str, vocab: str) -> BertTokenizer:
    """The vocabulary a continued run reads with when the recipe names one beside its checkpoint: the given one
    where the checkpoint has none of its own or the same; another is refused, since the checkpoint's embedding
    rows are its own vocabulary's ids (it was dropped without a word, and the corpus read with the checkpoint's)."""
    given = load_vocabulary(vocab)
    try:
        own = load_vocabulary(init_from)
    except ValueError:  # weights and config without vocabulary files: the recipe's is the one to read with
        return given
    if own.vocab != given.vocab:
        raise UsageError(f"tokenizer.vocab {vocab} ({given.vocab_size:,} tokens) is not the vocabulary of "
                         f"model.init_from {init_from} ({own.vocab_size:,}), whose embeddings are rows of its own; "
                         "leave tokenizer.vocab out to continue with it (to add a corpus's pieces to it, "
                         "`bertforge adapt --vocab new` grows the checkpoint first)")
    return given


def tokenized_corpus(paths: list[str], tokenizer: BertTokenizer, folder: Path, data: DataSettings,
                     topology: Topology, resume: bool = False) -> TokenizedCorpus:
    """Tokenize once into `folder` (rank 0), reuse it on later runs and on the other ranks.

    Reused only when prepared from the same files, unchanged since, with the same settings (how
    documents are cut and read: data.document_boundary, data.text_field; the tokenizer's vocabulary
    and reading settings, `reading_settings`); otherwise a new run prepares it again and a resumed one stops (its data
    position belongs to the old corpus). The maximum length shapes the instances, not the corpus.
    """
    meta = folder / "meta.json"
    if topology.is_main:
        change = "not prepared yet"
        if meta.exists():
            recorded = json.loads(meta.read_text(encoding="utf-8"))
            wanted = {"document_boundary": data.document_boundary, "text_field": data.text_field,
                      "vocab_sha256": vocab_fingerprint(tokenizer.vocab),
                      **reading_settings(tokenizer), "text_rule": TEXT_RULE}
            change = cache_change({"text_rule": 1, **recorded}, recorded.get("source_files"), expand_paths(paths),
                                  wanted)
            if change:
                change = stale_cache(folder, change, resume, recorded="source_files" in recorded)
        if change:
            prepare_corpus(paths, tokenizer, folder, document_boundary=data.document_boundary,
                           text_field=data.text_field, overwrite=True)
    barrier(topology)
    corpus = TokenizedCorpus(folder)
    corpus.check_tokenizer(tokenizer)
    return corpus


def cache_change(settings: dict, source_files: list[dict] | None, paths: list[Path], wanted: dict) -> str | None:
    """Why a cache made with `settings` from `source_files` (their fingerprints) does not fit the files `paths`
    and the settings `wanted`; None if it does. A setting the cache does not record (an older bertforge's) is
    not compared (`train.resume.setting_changes`, the rule a resumed run's settings are checked by)."""
    changes = setting_changes(settings, wanted)
    if changes:
        return "made with other settings: " + "; ".join(changes)
    return changed_inputs(source_files, paths)


def stale_cache(folder: Path, change: str, resume: bool, recorded: bool) -> str | None:
    """A cache does not fit the recipe: a new run makes it again (returns `change`), a resumed run stops.

    A cache made before bertforge recorded its sources (recorded=False) cannot be checked: a
    resumed run keeps it, with a warning (returns None).
    """
    if resume and not recorded:
        logger.warning("%s does not record which files it was made from (an older bertforge); resuming with it", folder)
        return None
    if resume:
        raise BertforgeError(f"{folder} was made from other data than the recipe's ({change}); the checkpoints "
                             f"belong to that data, so --resume cannot continue: set the recipe back, {START_OVER}")
    logger.warning("%s does not fit the recipe (%s); making it again", folder, change)
    return change


def check_checkpoint_fits(recipe: PretrainRecipe) -> None:
    """One line, before a vocabulary is trained or a corpus prepared, for a checkpoint the instances do not fit: a
    max_seq_length past its position table (said after both corpora were prepared and the model loaded), or sentence
    pairs for a model of one token type (an IndexError 25 frames deep at the first step)."""
    if not recipe.model.init_from:
        return  # a new model is made to fit (its position table at least max_seq_length)
    from ...models.checkpoint import config_with_overrides
    from ...models.folder import read_model_folder
    from ...resources import resolve_model

    folder = read_model_folder(resolve_model(recipe.model.init_from)).transformer
    # the config build_model's from_pretrained makes: the checkpoint's, with the recipe's overrides
    config = config_with_overrides(BertConfig.from_json_file(folder / CONFIG_NAME), dict(recipe.model.overrides))
    config.checked_max_length(recipe.data.instances.max_seq_length, name="data.instances.max_seq_length")
    if recipe.data.instances.nsp and config.type_vocab_size < 2:
        raise UsageError(f"{recipe.model.init_from} has one token type (type_vocab_size {config.type_vocab_size}), "
                         "and next-sentence prediction needs two for its sentence pairs; continue without it: "
                         "data.instances.nsp=false")


def build_model(recipe: PretrainRecipe, tokenizer: BertTokenizer) -> BertForPreTraining:
    if recipe.model.init_from:
        model = BertForPreTraining.from_pretrained(recipe.model.init_from, **recipe.model.overrides)
    else:
        config = BertConfig.from_preset(recipe.model.preset, vocab_size=tokenizer.vocab_size,
                                        max_position_embeddings=max(512, recipe.data.instances.max_seq_length),
                                        **recipe.model.overrides)
        model = BertForPreTraining(config)
    if not recipe.data.instances.nsp:
        # Without sentence pairs no loss reaches the NSP head or the pooler it reads: frozen, they stay as they are,
        # as they did untrained, and DistributedDataParallel (which waits for every trainable weight's gradient)
        # does not wait for them under torchrun.
        model.bert.pooler.requires_grad_(False)
        model.cls.seq_relationship.requires_grad_(False)
    return model


class EndlessBatches:
    """Batches epoch after epoch from a PretrainingDataset; its cursor is the stream's position.

    Each batch also carries masked_positions (num_predictions,), found on the host, so that the
    masked-only MLM head never reads the labels back from the device. With one_shape (the loop replays its
    step from a CUDA graph) every full batch is padded to max_seq_length and its masked positions to
    batch_size x max_predictions_per_seq, pointing at an unlabelled token.
    """

    def __init__(self, dataset: PretrainingDataset, batch_size: int, one_shape: bool = False):
        self.dataset, self.batch_size, self.one_shape = dataset, batch_size, one_shape

    def __iter__(self):
        while True:  # num_workers=0: the dataset's cursor counts exactly the instances consumed
            # A private generator: a DataLoader draws a seed when it starts, and drawing it from the
            # global RNG would shift the dropout noise of a resumed run (which starts one mid-epoch).
            yield from DataLoader(self.dataset, batch_size=self.batch_size, collate_fn=self.collate,
                                  generator=torch.Generator())

    def collate(self, instances: list[dict]) -> dict[str, torch.Tensor]:
        if not self.one_shape:
            batch = self.dataset.collate(instances)
            return {**batch, "masked_positions": masked_positions_from(batch["labels"])}
        config = self.dataset.config
        batch = self.dataset.collate(instances, pad_to=config.max_seq_length)
        count = self.batch_size * config.max_predictions_per_seq
        return {**batch, "masked_positions": padded_masked_positions(batch["labels"], count)}

    def state_dict(self) -> dict:
        return self.dataset.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.dataset.load_state_dict(state)


def pretraining_statistics(batch: dict, output) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """(sum, count) pairs for MLM loss and accuracy over masked tokens, and NSP loss and accuracy.

    The losses are the head's own (output.mlm_loss / nsp_loss, means), weighted back into sums.
    """
    labels = batch["labels"]
    # Flat positions of the masked tokens: the collator's when it gave them (no read-back from the device).
    positions = batch["masked_positions"] if "masked_positions" in batch else masked_positions_from(labels)
    logits = output.prediction_logits
    if logits.dim() == 3:  # the full head scored every position
        logits = logits.flatten(0, 1).index_select(0, positions)
    targets = labels.flatten().index_select(0, positions)
    count = (targets != IGNORE_INDEX).sum()  # positions padded to one shape point at unlabelled tokens
    stats = {
        "mlm_loss": (output.mlm_loss.detach() * count, count),
        "mlm_accuracy": ((logits.argmax(-1) == targets).sum(), count),
    }
    if output.nsp_loss is not None:
        nsp_labels = batch["next_sentence_label"]
        size = len(nsp_labels)
        stats["nsp_loss"] = (output.nsp_loss.detach() * size, size)
        stats["nsp_accuracy"] = ((output.seq_relationship_logits.argmax(-1) == nsp_labels).sum(), size)
    return stats


@torch.inference_mode()
def evaluate_pretraining(model: BertForPreTraining, dataset: PretrainingDataset, batch_size: int,
                         max_batches: int, device: torch.device, masked_only: bool = True) -> dict[str, float]:
    """MLM loss/accuracy and NSP accuracy on held-out instances (the same ones every time)."""
    dataset.set_epoch(0)  # fixed instances: evaluations at different steps are comparable
    sums: dict[str, np.ndarray] = {}
    loader = DataLoader(dataset, batch_size=batch_size, collate_fn=dataset.collate)
    for index, batch in enumerate(loader):
        if index == max_batches:
            break
        batch = to_device(batch, device)
        output = model(**batch, masked_only=masked_only)
        for key, (total, count) in pretraining_statistics(batch, output).items():
            sums[key] = sums.get(key, 0) + np.array([float(total), float(count)])
    return {key: total / count for key, (total, count) in sums.items() if count}


def run_pretraining(recipe: PretrainRecipe, resume: bool = False, overwrite: bool = False) -> list[dict]:
    """Prepare data (once), build or load the model, train; returns the logged records (rank 0).

    The output folder follows `train.run_folder`: a new run, resume=True, or overwrite=True.
    """
    if not recipe.data.train:
        raise ValueError("the recipe has no data.train files; list the text files to pretrain on")
    device = select_device(recipe.training.device)
    run_dir = Path(recipe.training.output_dir)
    with process_group(device) as topology, \
            claim_run_folder(run_dir, command="bertforge pretrain", caches=("tokenizer", "data"), resume=resume,
                             overwrite=overwrite, enabled=topology.is_main):
        return pretrain_in(run_dir, recipe, resume, topology, device)


def pretrain_in(run_dir: Path, recipe: PretrainRecipe, resume: bool, topology: Topology,
                device: torch.device) -> list[dict]:
    check_checkpoint_fits(recipe)
    tokenizer = load_or_train_tokenizer(recipe, run_dir, topology, resume)
    train_corpus = tokenized_corpus(recipe.data.train, tokenizer, run_dir / "data" / "train", recipe.data, topology,
                                    resume)
    dataset = PretrainingDataset(train_corpus, recipe.data.instances, seed=recipe.training.seed,
                                 rank=topology.rank, world_size=topology.world_size)
    evaluate = None
    if recipe.data.heldout:
        heldout_corpus = tokenized_corpus(recipe.data.heldout, tokenizer, run_dir / "data" / "heldout", recipe.data,
                                          topology, resume)
        heldout = PretrainingDataset(heldout_corpus, recipe.data.instances, seed=12345)
        evaluate = lambda model: evaluate_pretraining(model, heldout, recipe.batch_size, recipe.data.eval_batches,
                                                      device, recipe.masked_only_head)
    torch.manual_seed(recipe.training.seed)  # the same fresh weights on every rank
    model = build_model(recipe, tokenizer)
    if topology.is_main:
        logger.warning("pretraining %s (%s parameters) on %s: %d documents, %s tokens",
                       type(model).__name__, f"{model.num_parameters():,}", device,
                       train_corpus.num_documents, f"{train_corpus.num_tokens:,}")
    one_shape = graphs_apply(recipe.training, device, topology)  # a replayed CUDA graph takes one batch shape
    return train(model, EndlessBatches(dataset, recipe.batch_size, one_shape), recipe.training,
                 statistics=pretraining_statistics, evaluate=evaluate, tokenizer=tokenizer, topology=topology,
                 device=device, resume=resume, forward_kwargs={"masked_only": recipe.masked_only_head},
                 inputs=run_inputs(recipe))
