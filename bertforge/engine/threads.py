"""How many threads a CPU forward pass should use: the physical cores this process may really run on.

`os.cpu_count()` counts every logical CPU of the machine. A container or `taskset` allows fewer
(sched_getaffinity), a cgroup quota (`cpu.max`, what `docker --cpus` and Kubernetes limits set)
may allow fewer still, and two hyper-threads of one core share its matrix units, so a matmul
thread per logical CPU only makes threads wait on each other. torch's own default is the
logical count; on a 2-core machine shared with another busy process, 2 threads ran 3-5x slower
than 1 (issue 24).
"""
from __future__ import annotations

import contextlib
import math
import os
import sys
from collections.abc import Iterator
from pathlib import Path

CPU_SYSFS = Path("/sys/devices/system/cpu")
CGROUP_ROOT = Path("/sys/fs/cgroup")
OWN_CGROUPS = Path("/proc/self/cgroup")  # the cgroups this process is in, a line per hierarchy


def allowed_cpus() -> set[int]:
    """The logical CPUs this process may be scheduled on (all of them where the OS cannot say)."""
    if hasattr(os, "sched_getaffinity"):
        return set(os.sched_getaffinity(0))
    return set(range(os.cpu_count() or 1))


def physical_cores(cpus: set[int], sysfs: Path = CPU_SYSFS) -> int:
    """How many distinct physical cores the logical CPUs `cpus` sit on (len(cpus) where sysfs is silent)."""
    cores = set()
    for cpu in cpus:
        topology = sysfs / f"cpu{cpu}" / "topology"
        try:
            package = (topology / "physical_package_id").read_text().strip()
            core = (topology / "core_id").read_text().strip()
        except OSError:
            return len(cpus)
        cores.add((package, core))
    return len(cores) or len(cpus)


def cgroup_cpu_quota(cgroup_root: Path = CGROUP_ROOT, membership: Path = OWN_CGROUPS) -> float | None:
    """CPUs' worth of time the cgroups this process is in allow (cpu.max `quota period`, or v1's cfs files): the
    smallest quota on the way from its own cgroup up to the root; None when none is set.

    In a container the root is the container's own cgroup (docker --cpus sets it there). On a host, a process
    put in a cgroup of its own (systemd's CPUQuota=, a scheduler's job) finds it by /proc/self/cgroup."""
    quotas = [quota for folder in cgroup_folders(cgroup_root, membership) if (quota := folder_quota(folder))]
    return min(quotas, default=None)


def cgroup_folders(cgroup_root: Path, membership: Path) -> list[Path]:
    """The folders whose CPU limits apply to this process: its own cgroup's and every parent's, v2 and v1."""
    try:
        lines = membership.read_text().splitlines()
    except OSError:
        lines = []
    tops = [cgroup_root, cgroup_root / "cpu", cgroup_root / "cpu,cpuacct"]
    folders = list(tops)
    for fields in (line.split(":", 2) for line in lines):
        if len(fields) == 3 and (fields[1] == "" or "cpu" in fields[1].split(",")):  # v2's line, or v1's cpu
            own = Path(fields[2].lstrip("/"))
            for top in tops:
                folders += [top / parent for parent in [own, *own.parents] if parent != Path(".")]
    return folders


def folder_quota(folder: Path) -> float | None:
    try:
        quota, period = (folder / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:  # cgroup v1
        quota = int((folder / "cpu.cfs_quota_us").read_text())
        period = int((folder / "cpu.cfs_period_us").read_text())
        return None if quota <= 0 else quota / period
    except (OSError, ValueError):
        return None


def requested_threads(environ=os.environ) -> int | None:
    """The thread count the user set for OpenMP (OMP_NUM_THREADS, which torch also reads), if a positive integer."""
    value = environ.get("OMP_NUM_THREADS", "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else None


def default_threads() -> int:
    """What a command uses without a --threads option: OMP_NUM_THREADS when set, else `usable_threads()`."""
    return requested_threads() or usable_threads()


def usable_threads(cpus: set[int] | None = None, sysfs: Path = CPU_SYSFS, cgroup_root: Path = CGROUP_ROOT) -> int:
    """Threads for compute: the physical cores under this process's affinity, capped by its cgroup
    quota (rounded up: a quota of 1.5 CPUs keeps 2 threads busy), and at least 1."""
    cpus = allowed_cpus() if cpus is None else cpus
    threads = physical_cores(cpus, sysfs)
    quota = cgroup_cpu_quota(cgroup_root)
    if quota is not None:
        threads = min(threads, math.ceil(quota))
    return max(1, threads)


# Whether CPU inference in this process chooses its thread count while it runs (engine/governor.py): set
# by a command's --threads through use_threads, off for a program that never calls it (a library user's
# torch.set_num_threads is theirs).
_chosen_while_running = False


def chosen_while_running(threads: int | None, environ=os.environ) -> bool:
    """Whether a command given `threads` (its --threads) leaves the count to the governor: neither it nor
    OMP_NUM_THREADS names one."""
    return threads is None and requested_threads(environ) is None


@contextlib.contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """The block runs torch's CPU operations on `count` threads in this thread; the count before is set again after
    (under OpenMP the count is the calling thread's own)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def use_threads(threads: int | None, environ=os.environ) -> None:
    """Every command's --threads (cli/parser.py adds it), applied before the command runs.

    Given: torch's CPU thread count, and the tokenizers' (RAYON_NUM_THREADS, read when their pool starts). Not
    given: OMP_NUM_THREADS when set, else the physical cores this process may use (`usable_threads`); torch's own
    default counts the machine's logical CPUs, which in a container allowed 2 CPUs of a 64-core host is 64
    threads taking turns on 2. CPU inference then chooses its count batch by batch up to that (engine/governor.py).
    torch takes the count from OMP_NUM_THREADS as it starts: a command that has not loaded it yet is not made to.
    """
    global _chosen_while_running
    _chosen_while_running = chosen_while_running(threads, environ)
    if threads is not None:
        environ["RAYON_NUM_THREADS"] = str(threads)
    count = threads if threads is not None else (None if requested_threads(environ) else usable_threads())
    if count is None:
        return
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(count)
    else:
        environ["OMP_NUM_THREADS"] = str(count)


def thread_governor(threads: str | None = None):
    """A ThreadGovernor for a CPU job when threads="auto", or when None and the command left the count to be
    chosen (use_threads(None)); else None: the job runs at torch's current count."""
    if threads not in (None, "auto"):
        raise ValueError(f'threads must be "auto" or None, got {threads!r}; for a fixed count call '
                         'torch.set_num_threads(n)')
    if threads == "auto" or _chosen_while_running:
        from .governor import ThreadGovernor

        return ThreadGovernor(usable_threads())
    return None


# libgomp (torch's OpenMP) spins a waiting thread for 300,000 rounds before it sleeps. Beside another busy
# process that spinning takes the core the thread it waits for needs: 2 threads embedded 25-36 texts/s where
# 1 thread made 164-311 (all-MiniLM-L6-v2, 2 cores, one busy). OMP_WAIT_POLICY=PASSIVE (no spin) halves int8
# on a quiet machine instead (520 -> 272 texts/s at 2 threads: every operation wakes a sleeping thread). A
# short spin keeps the quiet speed (532) and loses far less when shared (124).
SHORT_SPIN = "10000"


def spin_briefly(environ=os.environ) -> None:
    """Give OpenMP a short spin unless the user set a wait policy; before torch starts (libgomp reads it once)."""
    if "OMP_WAIT_POLICY" not in environ and "GOMP_SPINCOUNT" not in environ:
        environ["GOMP_SPINCOUNT"] = SHORT_SPIN
