"""Multi-process training under torchrun: NCCL on GPUs, gloo on the CPU.

Everything here is a no-op in a single process, so the loop reads the same either way.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..errors import BertforgeError, UsageError


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


def select_device(preference: str = "auto") -> torch.device:
    """This process's device: under torchrun its own GPU (LOCAL_RANK), else the GPU, else the CPU.

    preference: auto | cuda | cpu. Raises BertforgeError when CUDA is asked for and missing, or when
    torchrun started more processes on this machine than it has GPUs (NCCL refuses two ranks on
    one GPU with "Duplicate GPU detected"), naming both ways out.
    """
    if preference == "cpu" or (preference == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise BertforgeError("training.device=cuda, but torch sees no GPU; use training.device=cpu or auto")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    processes = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    gpus = torch.cuda.device_count()
    if processes > gpus:
        raise BertforgeError(
            f"torchrun started {processes} processes on this machine but it has {gpus} GPU(s), and each process "
            f"needs its own: use `torchrun --nproc_per_node {gpus}`, or training.device=cpu to run every "
            "process on the CPU (gloo)"
        )
    return torch.device("cuda", local_rank)


def device_from_option(value: str | None, option: str = "--device") -> torch.device:
    """A command's --device: None or "auto" as `select_device` picks (torchrun-aware); "cpu", "cuda",
    "cuda:N" as given, checked here so that a device torch cannot use is one line, not an error deep in torch."""
    if value in (None, "auto"):
        return select_device("auto")
    try:
        device = torch.device(value)
    except RuntimeError:
        raise UsageError(f"{option} {value!r} is not a device; use auto, cpu, cuda or cuda:N") from None
    if device.type not in ("cpu", "cuda"):
        raise UsageError(f"{option} {value}: bertforge runs on cpu or cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"{option} {value}: torch sees no GPU here; use {option} cpu (or auto)")
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        raise UsageError(f"{option} {value}: this machine has {torch.cuda.device_count()} GPU(s), numbered from 0")
    return device


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
