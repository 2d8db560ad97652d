"""The replayed training step's CPU-side logic: when the loop replays, the batches of one shape that a graph
needs (pretraining pads them, with the same loss and statistics), and which batches a GraphedStep takes.

The capture and the replay themselves need CUDA: tests/test_gpu.py checks a replayed run against an eager one.
"""
import dataclasses

import pytest
import torch

import bertforge
from bertforge import BertConfig
from bertforge.models.heads import IGNORE_INDEX, masked_positions_from, padded_masked_positions
from bertforge.tasks.pretraining.dataset import PretrainingConfig, PretrainingDataset
from bertforge.tasks.pretraining.recipe import EndlessBatches, pretraining_statistics
from bertforge.tasks.pretraining.shards import prepare_corpus
from bertforge.train import cuda_graph_step
from bertforge.train.config import TrainConfig
from bertforge.train.cuda_graph_step import GraphedStep, graphs_apply, shapes_of
from bertforge.train.distributed import Topology

CUDA, CPU = torch.device("cuda"), torch.device("cpu")


def test_graphs_apply_on_one_gpu_only_for_a_plain_step():
    config = TrainConfig()
    assert graphs_apply(config, CUDA, Topology())
    assert not graphs_apply(config, CPU, Topology())
    assert not graphs_apply(dataclasses.replace(config, cuda_graphs=False), CUDA, Topology())
    assert not graphs_apply(dataclasses.replace(config, grad_accumulation=2), CUDA, Topology())
    assert not graphs_apply(dataclasses.replace(config, compile=True), CUDA, Topology())
    assert not graphs_apply(config, CUDA, Topology(rank=0, world_size=2))


def test_padded_masked_positions_give_the_same_loss_and_statistics():
    torch.manual_seed(0)
    model = bertforge.BertForPreTraining(BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=1,
                                                    num_attention_heads=2, intermediate_size=48,
                                                    hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)).eval()
    ids = torch.randint(5, 99, (3, 10))
    labels = torch.full((3, 10), IGNORE_INDEX)
    labels[0, 3], labels[1, 1], labels[1, 7], labels[2, 9] = 11, 12, 13, 14
    batch = dict(input_ids=ids, attention_mask=torch.ones_like(ids), labels=labels,
                 next_sentence_label=torch.tensor([0, 1, 0]))
    plain = masked_positions_from(labels)
    padded = padded_masked_positions(labels, 9)
    assert padded.tolist()[:4] == plain.tolist() and len(padded) == 9
    assert (labels.flatten()[padded[4:]] == IGNORE_INDEX).all()
    with torch.no_grad():
        expected = model(**batch, masked_only=True, masked_positions=plain)
        actual = model(**batch, masked_only=True, masked_positions=padded)
    torch.testing.assert_close(actual.loss, expected.loss)
    ours = pretraining_statistics({**batch, "masked_positions": padded}, actual)
    theirs = pretraining_statistics({**batch, "masked_positions": plain}, expected)
    for key in ("mlm_accuracy", "mlm_loss"):
        assert [float(v) for v in ours[key]] == pytest.approx([float(v) for v in theirs[key]])
    assert padded_masked_positions(labels, 2).tolist() == plain.tolist()  # never cut: a longer one stays whole


def test_one_shape_batches_pad_to_the_longest_a_recipe_allows(corpus_files, tmp_path):
    from bertforge import BertTokenizer

    tokenizer = BertTokenizer.from_pretrained(corpus_files / "vocab")
    corpus = prepare_corpus([corpus_files / "train.txt"], tokenizer, tmp_path / "shards", progress=False)
    config = PretrainingConfig(max_seq_length=48, max_predictions_per_seq=7)
    shaped = iter(EndlessBatches(PretrainingDataset(corpus, config, seed=0), 4, one_shape=True))
    plain = iter(EndlessBatches(PretrainingDataset(corpus, config, seed=0), 4))
    shapes = set()
    for _ in range(5):
        one, other = next(shaped), next(plain)
        assert one["input_ids"].shape == (4, 48) and one["masked_positions"].shape == (4 * 7,)
        shapes.add(shapes_of(one))
        width = other["input_ids"].shape[1]  # the same instances, padded to the batch's longest
        assert torch.equal(one["input_ids"][:, :width], other["input_ids"])
        assert (one["attention_mask"][:, width:] == 0).all() and (one["labels"][:, width:] == IGNORE_INDEX).all()
        real = one["labels"].flatten()[one["masked_positions"]] != IGNORE_INDEX
        assert int(real.sum()) == len(other["masked_positions"])
    assert len(shapes) == 1 and None not in shapes


class FakeGraph:
    """Stands in for torch.cuda.CUDAGraph on the CPU: counts replays."""
    replays = 0

    def replay(self):
        self.replays += 1


def test_a_graphed_step_warms_up_then_replays_batches_of_its_shape(monkeypatch):
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.5)
    step = GraphedStep(model, optimizer, 1.0, bf16=False, forward_kwargs={})
    captured = []

    def fake_capture(batch, shapes):
        step.inputs, step.shapes = {k: v.clone() for k, v in batch.items()}, shapes
        step.learning_rates = [torch.tensor(0.0)]
        step.graph, step.output = FakeGraph(), "output"
        captured.append(shapes)

    monkeypatch.setattr(step, "capture", fake_capture)
    batch = lambda rows, value: {"x": torch.full((rows, 3), float(value))}
    taken = [step.run(batch(2, i)) for i in range(cuda_graph_step.WARMUP_STEPS)]
    assert taken == [None] * cuda_graph_step.WARMUP_STEPS and not captured  # warm-up: the caller runs them eagerly
    assert step.run(batch(2, 7)) == "output" and len(captured) == 1
    assert torch.equal(step.inputs["x"], batch(2, 7)["x"])  # the batch copied into the graph's inputs
    optimizer.param_groups[0]["lr"] = 0.25
    assert step.run(batch(2, 8)) == "output" and torch.equal(step.inputs["x"], batch(2, 8)["x"])
    assert float(step.learning_rates[0]) == 0.25  # the schedule's rate reaches the graph before the replay
    assert step.run(batch(1, 9)) is None  # another shape (a partial last batch): eager
    assert step.run({"x": torch.zeros(2, 3), "packing": object()}) is None  # not tensors alone: eager
    assert step.graph.replays == 2 and len(captured) == 1


def test_a_failed_capture_leaves_every_step_eager(monkeypatch):
    model = torch.nn.Linear(2, 2)
    step = GraphedStep(model, torch.optim.AdamW(model.parameters()), 1.0, bf16=False, forward_kwargs={})
    step.eager_steps = cuda_graph_step.WARMUP_STEPS

    def failing_graph():
        raise RuntimeError("operation not permitted when stream is capturing\nmore detail")

    monkeypatch.setattr(torch.cuda, "CUDAGraph", failing_graph)
    assert step.run({"x": torch.zeros(2, 3)}) is None and step.failed
    assert step.run({"x": torch.zeros(2, 3)}) is None
    assert step.optimizer.param_groups[0]["lr"] == 1e-3  # the plain rate back for the schedule
