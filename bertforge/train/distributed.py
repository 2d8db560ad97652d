"""Multi-process training under torchrun: NCCL on GPUs, gloo on the CPU.

Everything here is a no-op in a single process, so the loop reads the same either way.
"""
from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Topology:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


@contextlib.contextmanager
def process_group(device: torch.device) -> Iterator[Topology]:
    """This process's Topology for the block: under torchrun the process group is joined on entry and left on exit,
    unless it was joined already (a pipeline of recipes, adapt's, keeps one group through all of them)."""
    joined_before = dist.is_available() and dist.is_initialized()
    topology = init_distributed(device)
    try:
        yield topology
    except BaseException:
        if not joined_before:  # no barrier: the other ranks may be in a collective this one will never join
            shutdown(topology)
        raise
    if not joined_before:
        # Leave together: a rank that destroyed its gloo group while rank 0 was still finishing (the run folder's
        # record, written by rank 0 alone) aborted at exit, "terminate called without an active exception".
        barrier(topology)
        shutdown(topology)


def init_distributed(device: torch.device) -> Topology:
    """Join the process group torchrun describes in the environment (or stay single-process)."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size == 1:
        return Topology()
    topology = Topology(int(os.environ["RANK"]), world_size, int(os.environ.get("LOCAL_RANK", "0")))
    if device.type == "cuda":
        torch.cuda.set_device(device)  # NCCL's collectives run on the current device
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    return topology


def all_reduce_sum(values: torch.Tensor, topology: Topology) -> torch.Tensor:
    """Sum a tensor of statistics over ranks; unchanged in a single process.

    NCCL reduces GPU tensors only: a CPU tensor (a verdict made on the host) goes over and back.
    """
    if not topology.distributed:
        return values
    if dist.get_backend() == "nccl" and values.device.type != "cuda":
        on_gpu = values.to(torch.device("cuda", torch.cuda.current_device()))
        dist.all_reduce(on_gpu, op=dist.ReduceOp.SUM)
        return on_gpu.to(values.device)
    dist.all_reduce(values, op=dist.ReduceOp.SUM)
    return values


def barrier(topology: Topology) -> None:
    if topology.distributed:
        dist.barrier()


def shutdown(topology: Topology) -> None:
    if topology.distributed and dist.is_initialized():
        dist.destroy_process_group()


def broadcast_parameters(model: torch.nn.Module, topology: Topology) -> None:
    """Every rank starts from rank 0's weights, as DistributedDataParallel's constructor makes them."""
    if topology.distributed:
        for parameter in model.parameters():
            dist.broadcast(parameter.data, src=0)


def average_gradients(model: torch.nn.Module, topology: Topology) -> None:
    """Each gradient averaged over the ranks, as DistributedDataParallel's reducer leaves it: one all-reduce of them
    all flattened. For a model whose backward is several passes (the gradient cache), which DDP's hooks refuse."""
    if not topology.distributed:
        return
    gradients = [p.grad for p in model.parameters() if p.grad is not None]
    flat = all_reduce_sum(torch._utils._flatten_dense_tensors(gradients), topology).div_(topology.world_size)
    for gradient, synced in zip(gradients, torch._utils._unflatten_dense_tensors(flat, gradients)):
        gradient.copy_(synced)
