"""Multi-process training under torchrun: gloo on CPU, NCCL on GPU.

Everything here is a no-op in a single process, so the loop reads the same either way.
"""
from __future__ import annotations

import os
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


def select_device() -> torch.device:
    """This process's GPU under torchrun (LOCAL_RANK), the GPU on one process, else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def init_distributed(device: torch.device) -> Topology:
    """Join the process group torchrun describes in the environment (or stay single-process)."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size == 1:
        return Topology()
    topology = Topology(int(os.environ["RANK"]), world_size, int(os.environ.get("LOCAL_RANK", "0")))
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    return topology


def all_reduce_sum(values: torch.Tensor, topology: Topology) -> torch.Tensor:
    """Sum a tensor of statistics over ranks (in place); unchanged in a single process."""
    if topology.distributed:
        dist.all_reduce(values, op=dist.ReduceOp.SUM)
    return values


def barrier(topology: Topology) -> None:
    if topology.distributed:
        dist.barrier()


def shutdown(topology: Topology) -> None:
    if topology.distributed and dist.is_initialized():
        dist.destroy_process_group()
