"""Who may write into a run's output folder, and what happens to a previous run there.

One policy for every training command (pretrain, finetune, readmission train):
- a new run needs a folder without a previous run in it (checkpoints, metrics, a best model,
  results): starting over a previous run used to let `keep_last` delete the new run's
  checkpoints and keep the old run's, under a metrics.jsonl describing the new one;
- `--resume` continues the run there and needs a complete checkpoint to continue from;
- `--overwrite` removes the previous run's files (only those: a user's other files stay) first.
Caches (the trained vocabulary, the prepared corpus) are not a run: a new run reuses them when
they were made from the same files, and rebuilds them otherwise.

While a run goes on it holds an exclusive lock on `FOLDER/.bertforge.lock` (flock: the kernel
drops it when the process dies, even by SIGKILL, so a crash never leaves a stale lock), and a
second run pointed at the same folder refuses to start.
"""
from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import shutil
import sys
from pathlib import Path
from typing import Iterator

from ..atomic import remove_stale_temporaries
from ..errors import BertforgeError, UsageError
from .checkpointing import STEP_PATTERN, list_checkpoints

logger = logging.getLogger("bertforge")

LOCK_FILE = ".bertforge.lock"
RUN_FILES = ("metrics.jsonl", "results.json", "scores.csv", "curves.png", "tensorboard", "best")
CACHE_FOLDERS = ("tokenizer", "data")


@contextlib.contextmanager
def claim_run_folder(folder: str | os.PathLike, *, resume: bool = False, overwrite: bool = False,
                     enabled: bool = True) -> Iterator[Path]:
    """Hold `folder` for one run (new, resumed or overwritten) until the block ends.

    enabled=False (the other ranks of a torchrun job, which share rank 0's claim) does nothing.
    Raises UsageError for --resume with nothing to resume, a previous run without --resume or
    --overwrite, or a path that is a file; BertforgeError when another run holds the folder.
    """
    folder = Path(folder)
    if not enabled:
        yield folder
        return
    if resume and overwrite:
        raise UsageError("--resume continues the run in the output folder and --overwrite deletes it: pass one")
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"output folder {folder} is a file; give a folder path")
    created = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    try:
        with run_lock(folder):
            prepare_for_this_run(folder, resume, overwrite)
            yield folder
    finally:
        if created:
            remove_if_unused(folder)


def prepare_for_this_run(folder: Path, resume: bool, overwrite: bool) -> None:
    """Under the lock: clear what killed runs left half-written, check the previous run against
    the flags, and remove it for --overwrite."""
    for place in (folder, *(folder / name for name in ("best", *CACHE_FOLDERS))):
        remove_stale_temporaries(place)  # what a run killed mid-save left: no one else can be writing now
    previous = previous_run(folder)
    if resume and not list_checkpoints(folder):
        start = ", and --overwrite to start again" if previous else ""
        raise UsageError(f"nothing to resume in {folder}: it has no complete checkpoint "
                         f"({previous or 'no run was saved there'}); run without --resume{start}")
    if previous and not resume:
        if not overwrite:
            raise UsageError(f"{folder} already holds a run ({previous}); pass --resume to continue it, "
                             "--overwrite to replace it, or choose another output folder")
        remove_run(folder)
        logger.warning("--overwrite: removed the previous run in %s (%s)", folder, previous)


def remove_if_unused(folder: Path) -> None:
    """Remove a folder this claim made when the run left nothing in it but the lock (bad data, say),
    so that a failed command does not leave an empty run folder behind."""
    try:
        if {entry.name for entry in folder.iterdir()} <= {LOCK_FILE}:
            (folder / LOCK_FILE).unlink(missing_ok=True)
            folder.rmdir()
    except OSError:  # something else appeared there meanwhile: it stays
        pass


def previous_run(folder: Path) -> str | None:
    """What a previous run left in `folder`, in words; None when there is none."""
    checkpoints = [p for p in folder.iterdir() if STEP_PATTERN.match(p.name)]
    complete = list_checkpoints(folder)
    parts = []
    if checkpoints:
        last = f", the last at step {int(STEP_PATTERN.match(complete[-1].name).group(1))}" if complete else ""
        parts.append(f"{len(checkpoints)} checkpoint{'s' if len(checkpoints) > 1 else ''}{last}")
    parts += [name for name in RUN_FILES if (folder / name).exists()]
    return ", ".join(parts) or None


def remove_run(folder: Path) -> None:
    """Delete a previous run's files and caches; anything else in the folder is left alone."""
    for entry in folder.iterdir():
        if STEP_PATTERN.match(entry.name) or entry.name in RUN_FILES or entry.name in CACHE_FOLDERS:
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()


@contextlib.contextmanager
def run_lock(folder: Path) -> Iterator[None]:
    """An exclusive, non-blocking lock on folder/.bertforge.lock; BertforgeError naming the holder if taken."""
    try:
        import fcntl
    except ImportError:  # Windows: no flock; runs are not protected from each other there
        logger.warning("no file locking on this platform: make sure no other run writes to %s", folder)
        yield
        return
    path = folder / LOCK_FILE
    with open(path, "a+", encoding="utf-8") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = describe_holder(handle.read())
            raise BertforgeError(f"{folder} is in use by another run ({holder}); wait for it to finish, "
                                 "or give this run another output folder") from None
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps({"pid": os.getpid(), "started": datetime.datetime.now().isoformat(timespec="seconds"),
                                 "command": " ".join(sys.argv)}) + "\n")
        handle.flush()
        try:
            yield
        finally:  # the file stays (deleting it would let two runs lock two different files); the lock goes
            fcntl.flock(handle, fcntl.LOCK_UN)


def describe_holder(text: str) -> str:
    try:
        holder = json.loads(text)
        return f"pid {holder['pid']}, started {holder['started']}: {holder['command']}"
    except (ValueError, KeyError, TypeError):
        return "a process that has not yet said who it is"
