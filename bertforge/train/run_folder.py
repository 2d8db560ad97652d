"""Who may write into a run's output folder, and what happens to a previous run there.

One policy for every training command (pretrain, finetune, sbert train, readmission train, adapt's stages):
- a new run needs a folder without a previous run in it (checkpoints, metrics, a best model,
  results): starting over a previous run used to let `keep_last` delete the new run's
  checkpoints and keep the old run's, under a metrics.jsonl describing the new one;
- `--resume` continues the run there and needs a complete checkpoint to continue from;
- `--overwrite` removes the previous run's files (only those: a user's other files stay) first;
- a folder holds one command's runs: a new run writes FOLDER/RUN_RECORD (the command, when, and the
  caches it made), and any other command refuses that folder, resume, overwrite or not (`sbert train
  --resume` in a finetune run used to pass over finetune's checkpoints as damaged and start at step 0).
  Another kind of output (an index, an adapt folder, a prepared corpus, a model checkpoint) is refused too.
  A run folder from before the record (none there) is accepted as before: nothing is inferred from its files.
Caches (pretrain's trained vocabulary and prepared corpus) are not a run: a new run reuses them when
they were made from the same files, and rebuilds them otherwise. `--overwrite` removes a cache only
when the record says this command made it (a `data/` folder that was there before is the user's).
A new run that fails before its first step (a forward pass that fails, say) takes back what it wrote
(an empty metrics.jsonl, its record), so that the corrected command is not refused as a rerun.

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

from ..atomic import remove_stale_temporaries, write_text
from ..errors import BertforgeError, UsageError
from ..models.weight_files import WEIGHT_FILES
from .checkpointing import STEP_PATTERN, list_checkpoints
from .run_log import METRICS_FILE, read_records

logger = logging.getLogger("bertforge")

LOCK_FILE = ".bertforge.lock"
PYTHON_API = "the Python API"  # the command a run started from Python (not the command line) is recorded under
RUN_RECORD = ".bertforge-run.json"  # {"command", "started", "caches"}: whose run the folder holds
RUN_FILES = (METRICS_FILE, "results.json", "scores.csv", "curves.png", "tensorboard", "best")
# The marks of bertforge's other outputs, which a run must not be written into. Literals: their owners
# (search/folder.py, adapt/stages.py, tasks/pretraining/shards.py) sit above train/; tests pin them to theirs.
INDEX_META, INDEX_FORMAT = "meta.json", "bertforge-index"
ADAPT_MARKER = "adapt.json"
CORPUS_TOKENS = "tokens.bin"


@contextlib.contextmanager
def claim_run_folder(folder: str | os.PathLike, *, command: str = PYTHON_API, caches: tuple[str, ...] = (),
                     resume: bool = False, overwrite: bool = False, enabled: bool = True) -> Iterator[Path]:
    """Hold `folder` for one run (new, resumed or overwritten) of `command` until the block ends.

    command: what the run record names ("bertforge finetune"); caches: the entries of the folder this kind of
    run makes and reuses across runs (pretrain's "tokenizer", "data"), the only ones besides a run's files
    that --overwrite may remove. enabled=False (the other ranks of a torchrun job, which share rank 0's
    claim) does nothing.
    Raises UsageError for --resume with nothing to resume, a previous run without --resume or --overwrite,
    another command's run or another kind of output there, or a path that is a file; BertforgeError when
    another run holds the folder.
    """
    folder = Path(folder)
    if not enabled:
        yield folder
        return
    if resume and overwrite:
        raise UsageError("--resume continues the run in the output folder and --overwrite deletes it: pass one")
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"output folder {folder} is a file; give a folder path")
    check_kind(folder, command)  # before the lock: not even a lock file goes into an index or a corpus
    created = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    try:
        with run_lock(folder):
            new_run = prepare_for_this_run(folder, command, caches, resume, overwrite)
            try:
                yield folder
            except BaseException:
                if new_run and not started(folder):
                    with contextlib.suppress(OSError):  # the run's own error is the one to report
                        remove_unstarted_run(folder)
                raise
            finally:
                if new_run:
                    settle_record(folder)
    finally:
        if created:
            remove_if_unused(folder)


def prepare_for_this_run(folder: Path, command: str, caches: tuple[str, ...], resume: bool, overwrite: bool) -> bool:
    """Under the lock: clear what killed runs left half-written, check the folder against the command and the
    flags, remove the previous run for --overwrite; True when a new run starts (its record is written)."""
    for place in (folder, *(folder / name for name in ("best", *caches))):
        remove_stale_temporaries(place)  # what a run killed mid-save left: no one else can be writing now
    record = read_run_record(folder)
    if record is not None and record["command"] != command:
        raise UsageError(f"{folder} holds a run of {record['command']}, not of {command}; give this run another "
                         f"output folder (--resume and --overwrite act only on a run of the same command)")
    previous = previous_run(folder)
    if resume and not list_checkpoints(folder):
        start = ", and --overwrite to start again" if previous else ""
        raise UsageError(f"nothing to resume in {folder}: it has no complete checkpoint "
                         f"({previous or 'no run was saved there'}); run without --resume{start}")
    if previous and not resume:
        if not overwrite:
            raise UsageError(f"{folder} already holds a run ({previous}); pass --resume to continue it, "
                             "--overwrite to replace it, or choose another output folder")
        remove_run(folder, owned_caches(record, caches))
        logger.warning("--overwrite: removed the previous run in %s (%s)", folder, previous)
    if resume:
        return False  # the run goes on under the record it has (none, for a folder older than records)
    made = [name for name in caches if name in owned_caches(record, caches) or not (folder / name).exists()]
    write_text(folder / RUN_RECORD, json.dumps({"command": command, "started": now(), "caches": made}) + "\n")
    return True


def check_kind(folder: Path, command: str) -> None:
    """UsageError when `folder` is another kind of bertforge output, which a run's files would be mixed into."""
    kind = other_output(folder)
    if kind:
        raise UsageError(f"{folder} is {kind}, not a run folder; give {command} a new or empty output folder")


def other_output(folder: Path) -> str | None:
    """What kind of bertforge output other than a run `folder` is, in words; None for none."""
    if (folder / ADAPT_MARKER).is_file():
        return f"an adapt output folder ({ADAPT_MARKER})"
    if (folder / CORPUS_TOKENS).is_file():
        return f"a prepared corpus ({CORPUS_TOKENS})"
    if (folder / "config.json").is_file() and any((folder / name).exists() for name in WEIGHT_FILES):
        return "a model checkpoint (config.json and its weights)"  # a run keeps its models in subfolders (best/)
    try:
        meta = json.loads((folder / INDEX_META).read_text(encoding="utf-8"))
    except (OSError, ValueError):  # none, or not bertforge's
        return None
    return f"a search index ({INDEX_META})" if isinstance(meta, dict) and meta.get("format") == INDEX_FORMAT else None


def read_run_record(folder: Path) -> dict | None:
    """The folder's run record; None for a folder without one (new, or a run from before records)."""
    path = folder / RUN_RECORD
    if not path.exists():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(record, dict) and isinstance(record.get("command"), str) and isinstance(record["caches"], list):
            return record
    except (OSError, ValueError, KeyError):
        pass
    raise UsageError(f"{path} is not a run record bertforge can read (written by hand?); delete it if {folder} "
                     "holds a run of this command, or choose another output folder")


def owned_caches(record: dict | None, caches: tuple[str, ...]) -> tuple[str, ...]:
    """The caches that the record says this command made: without a record, none (nothing is inferred)."""
    return tuple(name for name in caches if record and name in record["caches"])


def settle_record(folder: Path) -> None:
    """At the end of a new run: the record's caches are narrowed to those the run made (a folder the user adds
    later under such a name stays theirs), and a record with neither a run nor a cache to speak for goes."""
    path = folder / RUN_RECORD
    try:
        record = read_run_record(folder)
    except UsageError:  # changed by hand meanwhile: left for the next claim to refuse
        return
    if record is None:
        return
    made = [name for name in record["caches"] if (folder / name).exists()]
    with contextlib.suppress(OSError):  # a full disk, say: the record stays as it was, and so does the error
        if not made and previous_run(folder) is None:
            path.unlink()
        elif made != record["caches"]:
            write_text(path, json.dumps({**record, "caches": made}) + "\n")


def started(folder: Path) -> bool:
    """Whether the run in `folder` got past its start: a checkpoint, or a logged record past step 0."""
    if any(STEP_PATTERN.match(entry.name) for entry in folder.iterdir()):
        return True
    try:
        return any(record.get("step", 0) > 0 for record in read_records(folder / METRICS_FILE))
    except FileNotFoundError:
        return False
    except (OSError, ValueError, AttributeError, TypeError):  # damaged: not ours to judge, so it stays
        return True


def remove_unstarted_run(folder: Path) -> None:
    """After a new run failed before its first step: its files (an empty metrics.jsonl, say) go, so that the
    corrected command is not refused as a rerun; only a run's files, all written by this run (none were there)."""
    remove_run(folder, ())
    logger.info("the run failed before its first step: removed what it had written to %s", folder)


def remove_if_unused(folder: Path) -> None:
    """Remove a folder this claim made when the run left nothing in it but the lock (bad data, say),
    so that a failed command does not leave an empty run folder behind."""
    try:
        if {entry.name for entry in folder.iterdir()} <= {LOCK_FILE, RUN_RECORD}:
            for name in (LOCK_FILE, RUN_RECORD):
                (folder / name).unlink(missing_ok=True)
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


def remove_run(folder: Path, caches: tuple[str, ...]) -> None:
    """Delete a previous run's files and the given caches (those its command made); anything else stays."""
    for entry in folder.iterdir():
        if STEP_PATTERN.match(entry.name) or entry.name in RUN_FILES or entry.name in caches:
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
        handle.write(json.dumps({"pid": os.getpid(), "started": now(), "command": " ".join(sys.argv)}) + "\n")
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


def now() -> str:
    return datetime.datetime.now().isoformat(timespec="seconds")
