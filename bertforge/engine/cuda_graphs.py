"""Inference passes replayed from CUDA graphs: one launch a pass instead of a few hundred.

A small encoder's pass on a GPU waits on the host: all-MiniLM-L6-v2 on an H200 kept the GPU busy
16-26% of an eager `embed` run, launching the pass's ~150 kernels one by one from Python. A CUDA graph
records those launches once and replays them with one call: 1.54x the eager passes at batch 32
(scripts/results/gpu_h200_2026-11-26b.md).

A graph replays fixed shapes, so a pass is padded up to a bucket: rows to the next power of two,
length to the next multiple of a step that grows with the length (LENGTH_STEPS: 8 up to 64 tokens,
then 16, 32, 64), so that a length past 32 tokens gains at most a quarter. The extra columns are
padding the attention mask hides (pooling masks them too); each extra row holds one attended pad
token, so that no row's attention is fully masked (a NaN otherwise), and its result is dropped. One
graph is captured per bucket the first time a pass falls in it (or all at once: `capture_all`); all
share one memory pool, which is safe because passes run one at a time, in one thread, and each result
is copied out before the next replay. A pass larger than the biggest bucket runs as it is, without a
graph. A graph reads the weights where they were at capture: when they move (`model.to`, `half()`, a
state dict loaded with assign=True), every bucket is captured anew. Graphs are a speed-up, never a
requirement: when a capture fails (out of GPU memory for a bucket's pool, an operator that cannot be
captured), a warning says so and every pass runs eagerly from then on.

The same padding runs without graphs where there is no CUDA (`capture=False`), so the CPU's tests
check what the buckets do to the results.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

# (up to this length, round up to a multiple of this). A single step of 32 made the passes of 2,000 real texts
# (34 tokens on average) 1.32-1.42x the tokens of their eager passes, and batch 128 ran 0.91x as fast with graphs
# as without on an H200; these steps make them 1.08-1.11x (scripts/results/gpu_h200_2026-11-26b.md).
LENGTH_STEPS = ((64, 8), (128, 16), (256, 32), (512, 64))
LONG_STEP = 128  # past the last bound (models with more than 512 positions)
MAX_ROWS = 256
MAX_PADDED_TOKENS = 65_536  # rows x length of the largest graph: a bound on the memory each bucket holds

Pass = Callable[[Tensor, Tensor, Tensor], Tensor]  # (input_ids, token_type_ids, attention_mask) -> (rows, ...)


def bucket_length(length: int) -> int:
    """A pass's length rounded up to its bucket's."""
    step = next((step for bound, step in LENGTH_STEPS if length <= bound), LONG_STEP)
    return -(-length // step) * step


def bucket(rows: int, length: int) -> tuple[int, int] | None:
    """The (rows, length) a pass is padded to; None when it is past the largest graph."""
    padded_rows = 1 << max(0, rows - 1).bit_length()
    padded_length = bucket_length(length)
    if padded_rows > MAX_ROWS or padded_rows * padded_length > MAX_PADDED_TOKENS:
        return None
    return padded_rows, padded_length


@dataclass
class Captured:
    """One bucket's inputs, which each replay overwrites, its graph and the output it writes."""

    input_ids: Tensor
    token_type_ids: Tensor
    attention_mask: Tensor
    graph: torch.cuda.CUDAGraph | None = None
    output: Tensor | None = None


class GraphedPasses:
    """run(input_ids, token_type_ids, attention_mask) -> (rows, ...) tensor, replayed from one CUDA graph a bucket.

    `run` must be a pure function of its three inputs that reads nothing back to the host (no sync, no
    data-dependent shape) and treats masked positions as absent. Call it under torch.inference_mode()
    with the model in eval mode, as the passes it replaces are.
    """

    def __init__(self, run: Pass, device: torch.device, pad_id: int, capture: bool | None = None,
                 weights: Callable[[], tuple] = tuple):
        """weights() -> what the graphs read besides their inputs (the weights' addresses), checked each pass."""
        self.run = run
        self.weights = weights
        self.captured_weights = weights()
        self.device = device
        self.pad_id = pad_id
        self.capture = device.type == "cuda" if capture is None else capture
        if self.capture and device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device, not {device}: leave cuda_graphs unset (it is on "
                             "where the model is on a GPU) or move the model there")
        self.buckets: dict[tuple[int, int], Captured] = {}
        self.pool = torch.cuda.graph_pool_handle() if self.capture else None
        self.failed = False  # a capture failed: every pass runs eagerly

    def __call__(self, input_ids: Tensor, token_type_ids: Tensor, attention_mask: Tensor) -> Tensor:
        rows, length = input_ids.shape
        shape = bucket(rows, length)
        if shape is None or self.failed:
            return self.run(input_ids, token_type_ids, attention_mask)
        weights = self.weights()
        if weights != self.captured_weights:  # the graphs would read memory the weights have left
            self.buckets.clear()
            self.captured_weights = weights
        try:
            captured = self.buckets.get(shape) or self.new_bucket(shape)
        except RuntimeError as error:  # torch.OutOfMemoryError is one
            self.give_up(error)
            return self.run(input_ids, token_type_ids, attention_mask)
        self.fill(captured, input_ids, token_type_ids, attention_mask)
        if captured.graph is None:
            return self.run(captured.input_ids, captured.token_type_ids, captured.attention_mask)[:rows]
        captured.graph.replay()
        return captured.output[:rows].clone()  # the next replay of any bucket may write over the output

    def capture_all(self, max_length: int) -> int:
        """Capture every bucket of passes up to max_length tokens now, not on a first pass (a server's first
        request of each shape would wait for its capture, two passes: the p99). Returns the number of buckets."""
        lengths = sorted({bucket_length(length) for length in range(1, max_length + 1)})
        rows = 1
        try:
            while rows <= MAX_ROWS and not self.failed:
                for length in lengths:
                    shape = bucket(rows, length)
                    if shape is not None and shape not in self.buckets:
                        self.new_bucket(shape)
                rows *= 2
        except RuntimeError as error:
            self.give_up(error)
        return len(self.buckets)

    def give_up(self, error: RuntimeError) -> None:
        """Every pass eager from now on, the graphs and their memory let go, and a warning that says why."""
        warnings.warn(f"CUDA graphs are off for this model: capturing a pass failed ({str(error).splitlines()[0]}); "
                      "its passes run eagerly, as with cuda_graphs=False", RuntimeWarning, stacklevel=3)
        self.failed = True
        self.buckets.clear()
        if self.capture:
            torch.cuda.empty_cache()

    def fill(self, captured: Captured, input_ids: Tensor, token_type_ids: Tensor, attention_mask: Tensor) -> None:
        """The bucket's inputs: the pass in the top-left corner, padding elsewhere, one attended pad a spare row."""
        rows, length = input_ids.shape
        captured.input_ids.fill_(self.pad_id)
        captured.token_type_ids.zero_()
        captured.attention_mask.zero_()
        captured.input_ids[:rows, :length].copy_(input_ids, non_blocking=True)
        captured.token_type_ids[:rows, :length].copy_(token_type_ids, non_blocking=True)
        captured.attention_mask[:rows, :length].copy_(attention_mask, non_blocking=True)
        captured.attention_mask[rows:, 0] = 1

    def new_bucket(self, shape: tuple[int, int]) -> Captured:
        def inputs(fill: int) -> Tensor:
            return torch.full(shape, fill, dtype=torch.long, device=self.device)

        captured = Captured(inputs(self.pad_id), inputs(0), inputs(1))
        if self.capture:
            self.record(captured)
        self.buckets[shape] = captured
        return captured

    def record(self, captured: Captured) -> None:
        """Capture the pass on the bucket's inputs into captured.graph, its output into captured.output."""
        static = (captured.input_ids, captured.token_type_ids, captured.attention_mask)
        # Warm-up on a side stream first, as capture wants (cuBLAS handles, kernels chosen, lazy state).
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            self.run(*static)
        torch.cuda.current_stream(self.device).wait_stream(side)
        captured.graph = torch.cuda.CUDAGraph()
        # thread_local: the threads beside this one (the next batches pinned by `embed`'s prefetching) may
        # call CUDA while this one captures; the default ("global") would fail them.
        with torch.cuda.graph(captured.graph, pool=self.pool, capture_error_mode="thread_local"):
            captured.output = self.run(*static)
