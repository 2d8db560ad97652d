"""What a benchmark reports beside its ratios: useful FLOPs, the device's peak, GPU-busy share.

Useful FLOPs count the real tokens only (padding is work a faster engine may skip), in the
encoder's matmuls: per layer and token 2 x (4 h^2 + 2 h i) for the projections and the
feed-forward, plus 4 h L for attention scores and context over a text of L tokens.
"""
from __future__ import annotations

import re
import time
from typing import Callable

import torch

# Dense (no sparsity) peaks in TFLOP/s from the vendors' data sheets, per precision.
GPU_PEAKS = {  # name fragment: {precision: TFLOP/s}
    "H200": {"fp32": 67.0, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4},
    "H100 80GB HBM3": {"fp32": 67.0, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4},  # SXM
    "H100 PCIe": {"fp32": 51.2, "tf32": 378.0, "fp16": 756.0, "bf16": 756.0},
    "H100": {"fp32": 67.0, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4},
    "A100": {"fp32": 19.5, "tf32": 156.0, "fp16": 312.0, "bf16": 312.0},
    "L4": {"fp32": 30.3, "tf32": 60.0, "fp16": 121.0, "bf16": 121.0},
}


def encoder_flops(lengths: list[int], hidden: int, intermediate: int, layers: int) -> float:
    """Useful forward FLOPs of a BERT encoder over texts of these real token counts."""
    per_token = 2 * (4 * hidden * hidden + 2 * hidden * intermediate)
    return float(layers * sum(per_token * n + 4 * hidden * n * n for n in lengths))


def peak_tflops(device: torch.device, precision: str) -> tuple[float | None, str]:
    """(peak TFLOP/s, where the number comes from) for this device and precision; None when unknown."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for fragment, peaks in GPU_PEAKS.items():
            if fragment in name:
                key = "tf32" if precision == "fp32" and torch.backends.cuda.matmul.allow_tf32 else precision
                return peaks.get(key), f"{name} data sheet ({key})"
        return None, f"{name}: peak unknown"
    return cpu_peak_tflops(precision)


def cpu_peak_tflops(precision: str) -> tuple[float | None, str]:
    """An estimate: threads x clock x FLOPs per cycle (2 FMA units of the widest vector the CPU has)."""
    try:
        info = open("/proc/cpuinfo", encoding="utf-8").read()
    except OSError:
        return None, "no /proc/cpuinfo"
    flags = set(re.search(r"^flags\s*:(.*)$", info, re.M).group(1).split())
    megahertz = float(re.search(r"^cpu MHz\s*:\s*([\d.]+)", info, re.M).group(1))
    lanes = 16 if "avx512f" in flags else 8 if "avx2" in flags else 4
    if precision in ("bf16",) and "avx512_bf16" in flags:
        lanes *= 2  # dot-products of bf16 pairs
    if precision == "int8" and ("avx512_vnni" in flags or "avx_vnni" in flags):
        lanes *= 4  # int8 dot-products of 4
    per_cycle = 2 * 2 * lanes  # 2 FMA units x (multiply + add)
    threads = torch.get_num_threads()
    return threads * megahertz * 1e6 * per_cycle / 1e12, f"estimate: {threads} thread(s) x {megahertz:.0f} MHz x {per_cycle}/cycle"


def gpu_busy_share(run: Callable[[], object]) -> float | None:
    """Share of the wall time of run() during which a CUDA kernel ran: the union of the kernels' intervals, so
    kernels overlapping on several streams count once. None without CUDA."""
    if not torch.cuda.is_available():
        return None
    profiler, wall_us = profiled_run(run)
    return min(1.0, kernel_time(kernels_of(profiler))[0] / wall_us)


def profiled_run(run: Callable[[], object]):
    """(torch profiler with the CPU and CUDA events of run(), run's wall time in microseconds), the GPU idle first."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as profiler:
        start = time.perf_counter()
        run()
        torch.cuda.synchronize()
        wall_us = (time.perf_counter() - start) * 1e6
    return profiler, wall_us


def kernels_of(profiler) -> list[tuple[float, float, str]]:
    """(start us, end us, name) of each CUDA kernel or copy the profiler saw, in start order."""
    return sorted((event.time_range.start, event.time_range.end, event.name) for event in profiler.events()
                  if event.device_type == torch.autograd.DeviceType.CUDA
                  and event.time_range.end > event.time_range.start)


def kernel_time(kernels: list[tuple[float, float, str]], gap_us: float = float("inf")) -> tuple[float, int, float]:
    """(microseconds some kernel ran: the union of their intervals, idle stretches between kernels longer than
    gap_us, their microseconds together) over kernels in start order."""
    busy, reach, gaps, idle = 0.0, None, 0, 0.0
    for begin, end, _ in kernels:
        if reach is not None and begin - reach > gap_us:
            gaps, idle = gaps + 1, idle + begin - reach
        if reach is None or end > reach:
            busy += end - (begin if reach is None else max(begin, reach))
            reach = end
    return busy, gaps, idle
