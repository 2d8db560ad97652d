"""PretrainingDataset: instances, epochs (dynamic and static), ranks, resuming, collation, errors."""
import json
import re

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from bertforge.errors import BertforgeError
from bertforge.tasks.pretraining import PretrainingConfig, PretrainingDataset, collate, prepare_corpus
from bertforge.tokenization.tokenizer import BertTokenizer


@pytest.fixture(scope="module")
def corpus(minilm_dir, data_dir, tmp_path_factory):
    """Chapters 1-20 of Pride and Prejudice, one document each (~900 instances of 128 tokens an epoch)."""
    text = (data_dir / "austen" / "prideprejudice.txt").read_text(encoding="utf-8")
    folder = tmp_path_factory.mktemp("pp")
    parts = re.split(r"\nChapter \d+\n", text)[1:21]
    (folder / "chapters.jsonl").write_text("".join(json.dumps({"text": part}) + "\n" for part in parts))
    return prepare_corpus(folder / "chapters.jsonl", BertTokenizer.from_pretrained(minilm_dir), folder / "prepared",
                          progress=False)


def epoch_instances(dataset, epoch):
    dataset.set_epoch(epoch)
    return list(dataset)


def fingerprint(instances):
    return [tuple(np.concatenate([i["input_ids"], i["labels"], [i.get("next_sentence_label", -1)]]).tolist())
            for i in instances]


def unmasked(instance):
    return np.where(instance["labels"] != -100, instance["labels"], instance["input_ids"])


def found_in(tokens, corpus, documents):
    """Whether `tokens` is an unbroken run of one of `documents`."""
    needle = np.asarray(tokens, dtype=np.int64).tobytes()
    return any(corpus.tokens(int(d)).tobytes().find(needle) % 8 == 0 for d in documents
               if needle in corpus.tokens(int(d)).tobytes())


# ---------------------------------------------------------------- instances

def test_instances_are_masked_pairs_of_real_text(corpus):
    dataset = PretrainingDataset(corpus, seed=0)
    length = len(dataset)  # of the current epoch: iterating to the end moves on to the next
    instances = list(dataset)
    assert len(instances) == length > 400
    vocab = corpus.vocab_tokens
    unused_or_special = {i for i, token in enumerate(vocab) if re.fullmatch(r"\[\w+\]", token)}
    for instance in instances:
        ids, labels, types = instance["input_ids"], instance["labels"], instance["token_type_ids"]
        assert ids.dtype == labels.dtype == types.dtype == np.int64 and len(ids) <= 128
        original = unmasked(instance)
        separators = np.flatnonzero(original == corpus.sep_token_id)
        assert original[0] == corpus.cls_token_id and len(separators) == 2 and separators[1] == len(ids) - 1
        assert types.tolist() == [0] * (separators[0] + 1) + [1] * (len(ids) - separators[0] - 1)
        num_candidates = len(ids) - 3
        assert (labels != -100).sum() == min(20, max(1, round(num_candidates * 0.15)))
        replaced = ids[(labels != -100) & (ids != corpus.mask_token_id) & (ids != labels)]
        assert not set(replaced.tolist()) & unused_or_special  # random tokens avoid [unusedN] and specials
    labels = [instance["next_sentence_label"] for instance in instances]
    assert 0.4 < np.mean(labels) < 0.7  # NotNext: half the chunks plus the forced one-sentence ones
    for instance in instances[:40]:  # A is an unbroken run of some chapter
        original = unmasked(instance)
        first_sep = int(np.flatnonzero(original == corpus.sep_token_id)[0])
        assert found_in(original[1:first_sep], corpus, range(corpus.num_documents))


def test_a_batch_mixes_many_documents(corpus):
    def source(instance):
        original = unmasked(instance)
        first_sep = int(np.flatnonzero(original == corpus.sep_token_id)[0])
        return next(d for d in range(corpus.num_documents) if found_in(original[1:first_sep], corpus, [d]))

    instances = list(PretrainingDataset(corpus, seed=8))[:32]
    assert len({source(instance) for instance in instances}) >= 10  # of 20 chapters


def test_same_seed_same_instances_and_new_epoch_new_instances(corpus):
    first = fingerprint(epoch_instances(PretrainingDataset(corpus, seed=1), 0))
    assert fingerprint(epoch_instances(PretrainingDataset(corpus, seed=1), 0)) == first
    assert len(set(fingerprint(epoch_instances(PretrainingDataset(corpus, seed=2), 0))) & set(first)) < 10
    next_epoch = fingerprint(epoch_instances(PretrainingDataset(corpus, seed=1), 1))
    assert len(set(next_epoch) & set(first)) < 10  # dynamic: new pairs and new masks


def test_static_data_repeats_its_dupe_factor_versions(corpus):
    dataset = PretrainingDataset(corpus, PretrainingConfig(dupe_factor=2), seed=1)
    epochs = [fingerprint(epoch_instances(dataset, epoch)) for epoch in range(4)]
    assert epochs[0] == epochs[2] and epochs[1] == epochs[3]
    assert len(set(epochs[0]) & set(epochs[1])) < 10


def test_iteration_runs_on_into_the_next_epoch(corpus):
    dataset = PretrainingDataset(corpus, seed=3)
    epoch0 = fingerprint(list(dataset))
    assert dataset.state_dict()["epoch"] == 1 and dataset.state_dict()["instances_consumed"] == 0
    epoch1 = fingerprint(list(dataset))
    assert epoch1 != epoch0 and epoch1 == fingerprint(epoch_instances(PretrainingDataset(corpus, seed=3), 1))


# ---------------------------------------------------------------- ranks

def test_ranks_split_the_documents_and_yield_equally_many(corpus):
    ranks = [PretrainingDataset(corpus, seed=4, rank=rank, world_size=3) for rank in range(3)]
    documents = [set(r.rank_documents().tolist()) for r in ranks]
    assert set.union(*documents) == set(range(corpus.num_documents)) and sum(map(len, documents)) == 20
    assert documents != [set(r.rank_documents(epoch=1).tolist()) for r in ranks]  # reshuffled each epoch
    length = len(ranks[0])
    per_rank = [list(r) for r in ranks]
    assert [len(instances) for instances in per_rank] == [length] * 3 and length > 100
    for rank, instances in zip(ranks, per_rank):
        for instance in instances[:10]:
            original = unmasked(instance)
            first_sep = int(np.flatnonzero(original == corpus.sep_token_id)[0])
            assert found_in(original[1:first_sep], corpus, rank.rank_documents(epoch=0))


# ---------------------------------------------------------------- resuming

@pytest.mark.parametrize("world_size, window, consumed", [(1, 10_000, 7), (1, 60, 7), (1, 1, 40), (2, 30, 9)])
def test_resume_gives_the_batches_of_an_uninterrupted_run(corpus, world_size, window, consumed):
    config = PretrainingConfig(max_seq_length=64, shuffle_window=window)

    def batches(dataset, count):
        loader = iter(DataLoader(dataset, batch_size=8, collate_fn=dataset.collate))
        return [next(loader) for _ in range(count)]

    def dataset():
        return PretrainingDataset(corpus, config, seed=5, rank=world_size - 1, world_size=world_size)

    expected = batches(dataset(), consumed + 5)[consumed:]  # one uninterrupted run
    interrupted = dataset()
    batches(interrupted, consumed)
    state = interrupted.state_dict()
    assert state["instances_consumed"] == 8 * consumed
    resumed = dataset()
    resumed.load_state_dict(state)
    for got, want in zip(batches(resumed, 5), expected, strict=True):
        assert got.keys() == want.keys() and all(torch.equal(got[key], want[key]) for key in got)


def test_resume_at_an_epoch_boundary(corpus):
    dataset = PretrainingDataset(corpus, PretrainingConfig(max_seq_length=64), seed=6)
    list(dataset)
    state = dataset.state_dict()
    resumed = PretrainingDataset(corpus, PretrainingConfig(max_seq_length=64), seed=6)
    resumed.load_state_dict(state)
    assert fingerprint(list(resumed)[:20]) == fingerprint(list(dataset)[:20])


def test_state_of_another_seed_is_refused(corpus):
    state = PretrainingDataset(corpus, seed=1).state_dict()
    with pytest.raises(BertforgeError, match="made with seed=1 and this run has seed=2: resume with the same seed"):
        PretrainingDataset(corpus, seed=2).load_state_dict(state)
    state = PretrainingDataset(corpus, seed=2, world_size=2).state_dict()
    with pytest.raises(BertforgeError, match=r"world_size=2 and this run has world_size=1: resume with as many "
                                             r"processes \(torchrun --nproc_per_node\)"):
        PretrainingDataset(corpus, seed=2).load_state_dict(state)


# ---------------------------------------------------------------- other modes

def test_mlm_only_instances_pack_sentences_without_a_label(corpus):
    config = PretrainingConfig(nsp=False, max_seq_length=96)
    single = corpus.subset([4])  # MLM-only needs no second document
    instances = list(PretrainingDataset(single, config))
    assert instances and all("next_sentence_label" not in i for i in instances)
    for instance in instances:
        original = unmasked(instance)
        assert len(original) <= 96 and not instance["token_type_ids"].any()
        assert original[0] == corpus.cls_token_id and np.flatnonzero(original == corpus.sep_token_id).tolist() == [
            len(original) - 1]
    batch = collate(instances[:4])
    assert "next_sentence_label" not in batch


@pytest.mark.parametrize("length", [128, 256])
def test_fifteen_percent_of_real_tokens_are_masked_at_any_sequence_length(corpus, length):
    """A fixed cap of 20 predictions (create_pretraining_data's, sized for 128 tokens) masked 8% of 256-token
    sequences and 4% of 512-token ones; the cap now follows the length unless the recipe sets one."""
    assert PretrainingConfig(max_seq_length=512).max_predictions_per_seq == 77  # Google's run_pretraining: 80
    dataset = PretrainingDataset(corpus, PretrainingConfig(max_seq_length=length), seed=0)
    instances = [instance for _, instance in zip(range(200), dataset)]
    real = sum(int((instance["input_ids"] != corpus.sep_token_id).sum()) - 1 for instance in instances)
    masked = sum(int((instance["labels"] != -100).sum()) for instance in instances)
    assert 0.14 < masked / real < 0.16


def test_whole_word_masking_dataset_keeps_words_whole(corpus):
    dataset = PretrainingDataset(corpus, PretrainingConfig(whole_word=True), seed=7)
    continuation = np.array([token.startswith("##") for token in corpus.vocab_tokens])
    pieces_masked = 0
    for instance in list(dataset)[:300]:
        masked = instance["labels"] != -100
        original = unmasked(instance)
        # A "##" piece is masked exactly when the piece before it is (unless that is [SEP]).
        inside = continuation[original][1:] & (original[:-1] != corpus.sep_token_id)
        assert (masked[1:][inside] == masked[:-1][inside]).all()
        pieces_masked += int((masked[1:] & inside).sum())
    assert pieces_masked > 20


# ---------------------------------------------------------------- collation

def test_collate_pads_to_the_longest_or_to_pad_to():
    instances = [{"input_ids": np.array([101, 7, 8, 102]), "token_type_ids": np.array([0, 0, 0, 0]),
                  "labels": np.array([-100, 5, -100, -100]), "next_sentence_label": 1},
                 {"input_ids": np.array([101, 9, 102]), "token_type_ids": np.array([0, 0, 1]),
                  "labels": np.array([-100, -100, -100]), "next_sentence_label": 0}]
    batch = collate(instances, pad_token_id=0)
    assert batch["input_ids"].tolist() == [[101, 7, 8, 102], [101, 9, 102, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 1, 0]]
    assert batch["token_type_ids"].tolist() == [[0, 0, 0, 0], [0, 0, 1, 0]]
    assert batch["labels"].tolist() == [[-100, 5, -100, -100], [-100, -100, -100, -100]]
    assert batch["next_sentence_label"].tolist() == [1, 0]
    assert all(tensor.dtype == torch.long for tensor in batch.values())
    assert collate(instances, pad_to=6)["input_ids"].shape == (2, 6)
    with pytest.raises(ValueError, match="more than pad_to=3"):
        collate(instances, pad_to=3)


# ---------------------------------------------------------------- errors

@pytest.mark.parametrize("options, message", [
    ({"max_seq_length": 4}, r"max_seq_length must be at least 5, got 4 \(\[CLS\] A \[SEP\] B \[SEP\]"),
    ({"dupe_factor": 0}, "dupe_factor must be at least 1, got 0"),
    ({"dupe_factor": 1.5}, "dupe_factor must be an integer, got 1.5"),
    ({"shuffle_window": 0}, "shuffle_window must be at least 1, got 0"),
    ({"mlm_probability": 0}, "mlm_probability must be greater than 0, got 0"),
])
def test_bad_config(options, message):
    with pytest.raises(ValueError, match=message):
        PretrainingConfig(**options)


def test_bad_rank_world_size_and_corpus(corpus):
    with pytest.raises(ValueError, match="need 0 <= rank < world_size"):
        PretrainingDataset(corpus, rank=2, world_size=2)
    with pytest.raises(ValueError, match="world_size=21 exceeds the corpus's 20 documents"):
        PretrainingDataset(corpus, world_size=21)
    with pytest.raises(ValueError, match=r"needs at least 2 documents \(.*chapters.jsonl read as 1\)"):
        PretrainingDataset(corpus.subset([0]))  # which corpus: a held-out set of one document did not say


def test_dataloader_workers_are_refused(corpus, monkeypatch):
    """Inside a DataLoader worker process torch's get_worker_info() is not None, and iterating there is refused. Set
    here in this process: a real worker (num_workers=1) was left behind by the refusal, and its DataLoader's
    finaliser waited 5 s on the forked process whenever a later test's garbage collection ran it."""
    from bertforge.tasks.pretraining import dataset as dataset_module

    dataset = PretrainingDataset(corpus)
    monkeypatch.setattr(dataset_module, "get_worker_info", lambda: object())
    with pytest.raises(ValueError, match="num_workers=0"):
        next(iter(DataLoader(dataset, batch_size=2, collate_fn=dataset.collate)))
