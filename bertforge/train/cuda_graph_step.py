"""The training step as one CUDA graph: captured once, then replayed for every batch of the same shapes.

A BERT training step is ~1,000 kernel launches, and at the batch sizes people train with the host launching
them is the bound: on an H200 a BERT-base bf16 step (32 x 128, masked-only head) took 0.036 s launched from
Python with the GPU busy 20% of it, and 0.013 s replayed from one graph (87% busy;
`benchmarks/bench_pretrain.py --device cuda --cuda-graph`). A graph replays fixed kernels on fixed memory, so:
- batches must have one shape: the pretraining stream pads to max_seq_length and its masked positions to a
  fixed count when the loop will replay (`one_shape`); a batch of another shape (a partial last batch) runs
  eagerly, which is correct, only slower;
- each batch is copied into the graph's input tensors, and the outputs (loss, logits) are the graph's own,
  overwritten by the next replay: the loop adds them to its running sums before that (same stream, in order);
- the gradients live in the graph's memory; clipping and AdamW (fused, capturable) run inside it, the
  learning rate read from device tensors that the schedule's value is copied into before each replay;
- dropout draws fresh noise on every replay (PyTorch's generator is graph-safe) from the seed the loop sets
  for the step, so a resumed run still draws what the original would have.
"""
from __future__ import annotations

import logging
import time
from typing import Any

import torch

from .config import TrainConfig
from .distributed import Topology
from .optim import clip_gradients

logger = logging.getLogger("bertforge")

WARMUP_STEPS = 3  # eager steps before the capture: optimizer state, cuBLAS workspaces, autocast's set-up


def graphs_apply(config: TrainConfig, device: torch.device, topology: Topology) -> bool:
    """Whether the loop replays its steps from a CUDA graph: asked for (the default), on a GPU, one process
    (DistributedDataParallel's all-reduce hooks are not captured here), one micro-batch a step, not compiled."""
    return (config.cuda_graphs and device.type == "cuda" and not topology.distributed
            and config.grad_accumulation == 1 and not config.compile)


def shapes_of(batch: dict[str, Any]) -> tuple | None:
    """The batch's tensor shapes and dtypes, by name; None when it holds something a graph cannot take in."""
    signature = []
    for name, value in sorted(batch.items()):
        if not isinstance(value, torch.Tensor):
            return None  # a Packing, or a Python value: the step depends on it on the host
        signature.append((name, tuple(value.shape), value.dtype))
    return tuple(signature)


class GraphedStep:
    """Forward, backward, clipping and AdamW of one batch, captured on the first batch after WARMUP_STEPS eager
    ones and replayed for each later batch of that batch's shapes. `run` answers None for a batch it does not
    take (warm-up, another shape): the loop then runs its eager step."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, max_grad_norm: float,
                 bf16: bool, forward_kwargs: dict[str, Any]):
        self.model, self.optimizer, self.max_grad_norm = model, optimizer, max_grad_norm
        self.bf16, self.forward_kwargs = bf16, forward_kwargs
        self.graph: torch.cuda.CUDAGraph | None = None
        self.inputs: dict[str, torch.Tensor] = {}
        self.output = None
        self.shapes: tuple | None = None
        self.learning_rates: list[torch.Tensor] = []
        self.eager_steps = 0
        self.replays = 0
        self.failed = False  # the capture raised: every step runs eagerly

    def run(self, batch: dict[str, Any]):
        """Replay the step on `batch` (on the device) and return the model's output; None: not taken, the caller
        runs this step eagerly (and it counts towards the warm-up)."""
        shapes = shapes_of(batch)
        if self.graph is None and not (self.failed or self.eager_steps < WARMUP_STEPS or shapes is None):
            self.capture(batch, shapes)
        if self.graph is None or shapes != self.shapes:
            self.eager_steps += 1
            return None
        for name, tensor in self.inputs.items():
            tensor.copy_(batch[name], non_blocking=True)
        for rate, group in zip(self.learning_rates, self.optimizer.param_groups):
            rate.fill_(group["lr"])  # the schedule's value for this step; a host scalar, no wait
        self.graph.replay()
        self.replays += 1
        return self.output

    def capture(self, batch: dict[str, torch.Tensor], shapes: tuple) -> None:
        started, groups = time.perf_counter(), self.optimizer.param_groups
        self.inputs, self.shapes = {name: tensor.clone() for name, tensor in batch.items()}, shapes
        self.learning_rates = [torch.tensor(float(group["lr"]), device=batch_device(batch)) for group in groups]
        saved = [(group["lr"], group["capturable"]) for group in groups]
        for group, rate in zip(groups, self.learning_rates):  # captured AdamW reads its rate from the device
            group["lr"], group["capturable"] = rate, True
        self.optimizer.zero_grad(set_to_none=True)  # the captured backward allocates the gradients in the graph
        try:
            graph = torch.cuda.CUDAGraph()
            # thread_local: the prefetch thread pins the next batches meanwhile, which is no work on this stream
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                # No cast cache: a captured graph cannot keep autocast's cached weight copies between replays.
                with torch.autocast("cuda", dtype=torch.bfloat16, enabled=self.bf16, cache_enabled=False):
                    output = self.model(**self.inputs, **self.forward_kwargs)
                output.loss.backward()
                clip_gradients(self.model.parameters(), self.max_grad_norm)  # 0: captures no clipping
                self.optimizer.step()
        except RuntimeError as error:  # a model that waits on the device or branches on a value cannot be captured
            logger.warning("the training step could not be captured as a CUDA graph (%s); training on with eager "
                           "steps (training.cuda_graphs=false skips the attempt)", str(error).splitlines()[0])
            self.failed = True
            self.optimizer.zero_grad(set_to_none=True)
            return
        finally:
            # The schedule and checkpoints keep seeing plain numbers (a checkpoint then resumes on a CPU too).
            for group, (rate, capturable) in zip(groups, saved):
                group["lr"], group["capturable"] = rate, capturable
        self.graph, self.output = graph, output
        logger.warning("training steps replay one CUDA graph from here (captured in %.1f s; one launch a step; "
                       "training.cuda_graphs=false runs them eagerly)", time.perf_counter() - started)


def batch_device(batch: dict[str, torch.Tensor]) -> torch.device:
    return next(iter(batch.values())).device
