"""Where the work runs: this process's device (torchrun-aware), a command's --device, and batches moved there.

Low in the picture because every kind of run needs it: training, `embed`, `predict`, `serve`.
"""
from __future__ import annotations

import os
from typing import Any

import torch

from ..errors import BertforgeError, UsageError


def select_device(preference: str = "auto") -> torch.device:
    """This process's device: under torchrun its own GPU (LOCAL_RANK), else the GPU, else the CPU.

    preference: auto | cuda | cpu. Raises UsageError when CUDA is asked for and missing, BertforgeError when
    torchrun started more processes on this machine than it has GPUs (NCCL refuses two ranks on
    one GPU with "Duplicate GPU detected"), naming both ways out.
    """
    if preference == "cpu" or (preference == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():  # a setting this machine cannot honour: exit 2, as --device cuda is
        raise UsageError("training.device=cuda, but torch sees no GPU; use training.device=cpu or auto")
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


def cpu_has_amx() -> bool:
    """Whether this CPU has AMX tiles (Xeon since Sapphire Rapids): bf16 matrix products in hardware. torch's
    check is private, hence the fallback."""
    return getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)()


def to_device(batch: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """Every tensor (and Packing) of a batch on `device`; other values as they are. Asynchronous on CUDA,
    so a batch in page-locked memory is copied while the device still works on the previous one."""
    non_blocking = device.type == "cuda"
    return {key: value.to(device, non_blocking=non_blocking) if hasattr(value, "to") else value
            for key, value in batch.items()}
