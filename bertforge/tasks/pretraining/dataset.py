"""Pretraining instances over a prepared corpus, epoch after epoch, for one rank; and their collation.

Randomness is keyed, not sequential across the epoch. The instances a document yields (which
sentences, which truncation) come from a generator seeded by (seed, epoch, document), so any rank
can count every rank's instances: equal counts keep DDP in lockstep. The shuffle and the masks of
one window of documents come from a generator seeded by (seed, epoch, rank, window), so resuming
from {epoch, instances consumed} replays at most one window to land on exactly the next instance.
"""
import math
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from ...errors import BertforgeError
from .masking import check_masking_args, mask_tokens, random_replacement_ids
from ...train.collate import pad_rows
from .pairs import build_pair, check_pair_args, plan_sentence_pairs
from ...validation import checked

# Stream tags: the same (seed, epoch) feeds independent generators for each kind of choice.
_ORDER, _PLAN, _WINDOW = range(3)


@dataclass
class PretrainingConfig:
    """How instances are made; defaults are create_pretraining_data's flags.

    dupe_factor None is dynamic (RoBERTa): new pairs and new masks every epoch. dupe_factor=N is
    static (BERT): N versions of the data, each with its own pairs and masks; epoch e is
    version e mod N, so every N epochs repeat the same instances in the same order.
    shuffle_window: the instances of consecutive documents (in the epoch's shuffled document
    order) are collected until there are at least this many, then shuffled together, so a batch
    mixes many documents; memory holds one window of plans, and resuming replays at most one.
    """
    max_seq_length: int = 128
    short_seq_prob: float = 0.1
    nsp: bool = True
    mlm_probability: float = 0.15
    max_predictions_per_seq: int | None = None  # None: enough for mlm_probability of a full sequence, 20 at least
    whole_word: bool = False
    dupe_factor: int | None = None
    shuffle_window: int = 10_000

    def __post_init__(self):
        check_pair_args(self.max_seq_length, self.short_seq_prob)
        if self.max_predictions_per_seq is None:
            # create_pretraining_data's 20 is sized for its 128 tokens (Google sets 80 for 512): a fixed 20 masked
            # 8% of 256-token sequences and 4% of 512-token ones, where the recipe promises 15%
            self.max_predictions_per_seq = max(20, math.ceil(self.mlm_probability * self.max_seq_length))
        check_masking_args(self.mlm_probability, self.max_predictions_per_seq)
        if self.dupe_factor is not None:  # None: dynamic masking
            checked("dupe_factor", self.dupe_factor)
        checked("shuffle_window", self.shuffle_window)


class PretrainingDataset(IterableDataset):
    """MLM (+NSP) instances from a `TokenizedCorpus`: dicts of input_ids, token_type_ids, labels
    ((seq,) int64 arrays) and next_sentence_label (int; absent with nsp=False).

    The dataset is a cursor: iteration resumes where the last one stopped, and an iteration that
    runs to the end moves to the next epoch. `set_epoch(e)` jumps to the start of epoch e;
    `state_dict()` / `load_state_dict()` save and restore the position. Rank `rank` of
    `world_size` takes every world_size-th document of the epoch's shuffled order, and all ranks
    stop after the same number of instances (the smallest rank's). Build batches with
    `DataLoader(dataset, batch_size=..., collate_fn=dataset.collate)` and num_workers=0.
    """

    def __init__(self, corpus, config: PretrainingConfig | None = None, seed: int = 0, rank: int = 0,
                 world_size: int = 1):
        self.corpus, self.config, self.seed = corpus, config or PretrainingConfig(), seed
        if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1 \
                or not isinstance(rank, int) or not 0 <= rank < world_size:
            raise ValueError(f"need 0 <= rank < world_size, got rank={rank!r}, world_size={world_size!r}")
        if world_size > corpus.num_documents:
            raise ValueError(f"world_size={world_size} exceeds the corpus's {corpus.num_documents} documents, so "
                             "some ranks would get none; prepare more (smaller) documents or use fewer ranks")
        if self.config.nsp and corpus.num_documents < 2:  # which corpus: the held-out set is the usual one
            sources = getattr(corpus, "meta", {}).get("sources")
            read = f" ({', '.join(map(str, sources))} read as {corpus.num_documents})" if sources else ""
            raise ValueError(f"next sentence prediction needs at least 2 documents{read}; add documents or set "
                             "nsp=False")
        self.rank, self.world_size = rank, world_size
        self._epoch, self._consumed = 0, 0
        self._lengths = {}  # epoch -> instances per rank, cached because counting plans every document
        vocab = corpus.vocab_tokens
        self._is_continuation = np.array([token.startswith("##") for token in vocab])
        # mask_tokens' own rule for its random replacements, worked out once here rather than for every sequence.
        self._random_ids = random_replacement_ids(vocab)
        self._special_ids = (corpus.cls_token_id, corpus.sep_token_id, corpus.pad_token_id)

    # ---- position

    @property
    def epoch(self) -> int:
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Start epoch `epoch` from its first instance on the next iteration."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"epoch must be a non-negative int, got {epoch!r}")
        self._epoch, self._consumed = epoch, 0

    def state_dict(self) -> dict:
        """Where iteration stands: {epoch, instances_consumed} (and seed, world_size to check on load)."""
        return {"epoch": self._epoch, "instances_consumed": self._consumed, "seed": self.seed,
                "world_size": self.world_size}

    def load_state_dict(self, state: dict) -> None:
        """Continue from a `state_dict()`; raises BertforgeError when seed or world_size differ from it.

        Not a ValueError: the resume takes that for a damaged checkpoint and passes over it, and a run resumed
        on another number of processes went back to step 0 with a warning (each rank's share of every epoch
        is cut by world_size, so the saved position means nothing to another split)."""
        for key, fix in (("seed", "the same seed"), ("world_size", "as many processes (torchrun --nproc_per_node)")):
            if key in state and state[key] != getattr(self, key):
                raise BertforgeError(f"the checkpoint's data order was made with {key}={state[key]} and this run has "
                                     f"{key}={getattr(self, key)}: resume with {fix}, or start over (without "
                                     "--resume into a new output folder, or with --overwrite)")
        self._epoch, self._consumed = int(state["epoch"]), int(state["instances_consumed"])

    def __len__(self) -> int:
        """Instances this rank yields in the current epoch (counting them plans every document once)."""
        return self._epoch_length(self._epoch)

    # ---- iteration

    def __iter__(self):
        if get_worker_info() is not None:
            raise ValueError("PretrainingDataset counts consumed instances in the main process for state_dict(); "
                             "use DataLoader(num_workers=0) (building an instance takes well under a millisecond)")
        for instance in self._instances(self._epoch, skip=self._consumed):
            self._consumed += 1
            yield instance
        self._epoch, self._consumed = self._epoch + 1, 0

    def _instances(self, epoch: int, skip: int):
        """This rank's instances of `epoch`, from the `skip`-th on."""
        epoch = self._content_epoch(epoch)
        limit = self._epoch_length(epoch) if self.world_size > 1 else None
        position = 0
        for window_index, (plans, keys) in enumerate(self._windows(epoch)):
            if position + len(keys) <= skip:  # a window consumed before the resume point: counting is enough
                position += len(keys)
                continue
            # One generator per window shuffles and masks: a Generator costs ~20 us to seed, too
            # much per instance. Resuming inside a window rebuilds its earlier instances to replay it.
            rng = np.random.default_rng([self.seed, epoch, self.rank, window_index, _WINDOW])
            for key_index in rng.permutation(len(keys)):
                if limit is not None and position >= limit:
                    return
                instance = self._instance(plans, *keys[key_index], rng)
                if position >= skip:
                    yield instance
                position += 1

    def _windows(self, epoch: int):
        """(plans by document, [(document, plan index)]) for runs of this rank's documents that hold
        at least shuffle_window instances (the last run may hold fewer)."""
        plans, keys = {}, []
        for document in self.rank_documents(epoch).tolist():
            plans[document] = self._plans(document, epoch)
            keys += [(document, index) for index in range(len(plans[document]))]
            if len(keys) >= self.config.shuffle_window:
                yield plans, keys
                plans, keys = {}, []
        if keys:
            yield plans, keys

    def _content_epoch(self, epoch: int) -> int:
        # Static data (dupe_factor=N) is epoch e mod N in every respect: order, pairs, masks.
        return epoch if self.config.dupe_factor is None else epoch % self.config.dupe_factor

    def rank_documents(self, epoch: int | None = None) -> np.ndarray:
        """The documents this rank takes its instances from in `epoch` (default: the current one), in order."""
        return self._document_order(self._epoch if epoch is None else epoch)[self.rank::self.world_size]

    def _document_order(self, epoch: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, self._content_epoch(epoch), _ORDER])
        return rng.permutation(self.corpus.num_documents)

    def _plans(self, document: int, epoch: int):
        # Seeded per document, not per rank, so that every rank can count every rank's instances.
        rng = np.random.default_rng([self.seed, epoch, document, _PLAN])
        return plan_sentence_pairs(self.corpus, document, rng, self.config.max_seq_length,
                                   self.config.short_seq_prob, self.config.nsp)

    def _epoch_length(self, epoch: int) -> int:
        epoch = self._content_epoch(epoch)
        if epoch not in self._lengths:
            counts = np.array([len(self._plans(doc, epoch)) for doc in range(self.corpus.num_documents)])
            order = self._document_order(epoch)
            per_rank = [int(counts[order[rank::self.world_size]].sum()) for rank in range(self.world_size)]
            self._lengths = {epoch: min(per_rank)}
        return self._lengths[epoch]

    def _instance(self, plans: dict, document: int, index: int, rng: np.random.Generator) -> dict:
        pair = build_pair(self.corpus, plans[document][index])
        config = self.config
        input_ids, labels = mask_tokens(
            pair.input_ids, rng, self.corpus.vocab_size, self.corpus.mask_token_id, self._special_ids,
            config.mlm_probability, config.max_predictions_per_seq, config.whole_word,
            word_starts=~self._is_continuation[pair.input_ids] if config.whole_word else None,
            random_token_ids=self._random_ids)
        instance = {"input_ids": input_ids, "token_type_ids": pair.token_type_ids, "labels": labels}
        if config.nsp:
            instance["next_sentence_label"] = pair.next_sentence_label
        return instance

    def collate(self, instances: list[dict], pad_to: int | None = None) -> dict[str, torch.Tensor]:
        """`collate` with this corpus's [PAD] id, padding to the longest instance of the batch (or to pad_to)."""
        return collate(instances, pad_token_id=self.corpus.pad_token_id, pad_to=pad_to)


def collate(instances: list[dict], pad_token_id: int = 0, pad_to: int | None = None) -> dict[str, torch.Tensor]:
    """Stack instances into (batch, seq) tensors, padded on the right to the longest or to `pad_to`.

    Returns input_ids, token_type_ids, attention_mask (1 = real token), labels (-100 on padding and
    unmasked positions) and next_sentence_label (batch,) when the instances have one. Raises
    ValueError for an empty batch or an instance longer than pad_to.
    """
    rows = {name: [instance[name] for instance in instances] for name in ("input_ids", "token_type_ids", "labels")}
    next_sentence = None
    if instances and "next_sentence_label" in instances[0]:
        next_sentence = {"next_sentence_label": [instance["next_sentence_label"] for instance in instances]}
    return pad_rows(rows, pad_token_id, row_fields=next_sentence, pad_to=pad_to)
