"""Write files and folders so that readers see the old version or the new one, never half of one.

Everything is written beside its target first (same file system, so publishing is a rename)
and renamed into place only when complete, after an fsync (a power cut after the rename cannot
leave an empty file); after an error the partial copy is removed. A process killed with SIGKILL
cannot remove its own leftovers, so temp names carry the writer's pid and the next writer of
the same target removes leftovers of writers that are no longer alive.

A folder is published by `published_folder`, whose caller says what an existing destination is:
its own to replace, a folder it shares with the user (a model folder with a README or .git) to
merge into, or one it must not touch.
"""
from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import BinaryIO, Iterable, Iterator, Literal

import numpy as np

TEMP_MARK = ".tmp-"  # .{name}.tmp-{pid}-{random}: hidden, and says whose it is
STALE_NAME = re.compile(rf"^\..+{re.escape(TEMP_MARK)}(\d+)-")
Existing = Literal["replace", "merge", "refuse"]


@contextlib.contextmanager
def staging_folder(target: Path) -> Iterator[Path]:
    """A hidden temp folder beside `target` to write into before publishing; removed on exit.

    What the caller did not move out (after an error, say) is deleted, so no half-written
    folder stays.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(target.parent)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}{TEMP_MARK}{os.getpid()}-", dir=target.parent))
    staging.chmod(0o777 & ~current_umask())  # mkdtemp's 0700 would follow the folder when it is published
    try:
        yield staging
    finally:
        shutil.rmtree(staging, ignore_errors=True)


@contextlib.contextmanager
def published_folder(destination: str | os.PathLike, *, existing: Existing) -> Iterator[Path]:
    """A temp folder beside `destination` to write a whole folder into; on success it becomes `destination`.

    A new destination appears in one rename. An existing one, by `existing`:
    - "replace": the writer owns it (a checkpoint, a cache): it is renamed aside, the new folder
      renamed in, then the old one deleted, so no reader ever sees a half-deleted or half-written
      folder under the name (a kill between the two renames leaves none there; both copies then
      carry temp names). The old folder's mode is kept, as `replaced_file` keeps a file's;
    - "merge": the user may keep other files in it (a model card, .git, a sentence-transformers
      module): each file written replaces its namesake in one rename and the rest stay; every file
      is whole, but a kill mid-publish can leave some files new and some old;
    - "refuse": only an empty folder is replaced; anything else raises OSError at the rename, so a
      folder that appeared while the work ran is never written over.
    Every file and folder written is fsynced before it is published, and every folder a rename changed is
    fsynced after it, so that the publishing survives a power cut. After an error in the body the temp
    folder is removed and `destination` is left as it was.
    Raises NotADirectoryError when `destination` (or a folder above it) is a file, PermissionError when
    it cannot be written; both before the body runs.
    """
    destination = Path(destination)
    check_folder_writable(destination)
    with staging_folder(destination) as staging:
        yield staging
        flush_tree(staging)
        if not destination.exists():
            os.rename(staging, destination)
        elif existing == "merge":
            merge_into(destination, staging)
        elif existing == "replace":
            staging.chmod(destination.stat().st_mode & 0o777)
            aside = staging.with_name(f"{staging.name}-old")  # a temp name: removed later if this writer dies
            os.rename(destination, aside)
            try:
                os.rename(staging, destination)
            except OSError:
                os.rename(aside, destination)
                raise
            shutil.rmtree(aside, ignore_errors=True)
        else:
            os.rename(staging, destination)  # fails unless destination is an empty folder
        flush_folder(destination.parent)  # the rename is an entry of the parent: durable once the parent is flushed


def merge_into(destination: Path, staging: Path) -> None:
    """Move every file under `staging` to its place under `destination`, each in one rename, then flush the
    folders that received them (and any made on the way) so that the renames are durable."""
    for written in sorted(staging.rglob("*")):
        if not written.is_dir():
            target = destination / written.relative_to(staging)
            target.parent.mkdir(parents=True, exist_ok=True)
            if target.exists():  # keeps its mode, as replaced_file's files do
                written.chmod(target.stat().st_mode & 0o777)
            os.replace(written, target)
    for folder in [staging, *staging.rglob("*")]:  # the files have moved out: the folders are what is left
        flush_folder(destination / folder.relative_to(staging))


def check_folder_writable(destination: Path) -> None:
    """Fail before any work when `destination` cannot become a folder: it or a folder above it is a file,
    or the nearest existing one of them is not writable."""
    existing = destination
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, f"{existing} is a file, not a folder", str(destination))
    if not os.access(existing, os.W_OK | os.X_OK):
        raise PermissionError(errno.EACCES, f"{existing} is not writable", str(destination))
    if existing == destination and not os.access(destination.parent, os.W_OK | os.X_OK):
        raise PermissionError(errno.EACCES, f"{destination.parent} is not writable", str(destination))


@contextlib.contextmanager
def replaced_file(target: str | os.PathLike) -> Iterator[Path]:
    """A temp path beside `target` to write; on success it replaces `target` in one rename.

    The temp path ends with the target's suffix (np.save and savefig pick the format from it).
    Missing parent folders are made; after an error the temp file is removed and `target`
    is left as it was. The file is fsynced before the rename and its folder after it.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.is_dir():
        raise IsADirectoryError(21, "Is a directory", str(target))  # before any work, not at the rename
    remove_stale_temporaries(target.parent)
    descriptor, name = tempfile.mkstemp(prefix=f".{target.stem}{TEMP_MARK}{os.getpid()}-", suffix=target.suffix,
                                        dir=target.parent)
    os.close(descriptor)
    temporary = Path(name)
    try:
        yield temporary
        flush_to_disk(temporary)
        # mkstemp makes the file 0600; a replaced file keeps its old mode, a new one gets the umask's
        temporary.chmod(target.stat().st_mode & 0o777 if target.exists() else 0o666 & ~current_umask())
        os.replace(temporary, target)
        flush_folder(target.parent)  # the rename is an entry of the folder, as published_folder's renames are
    finally:
        temporary.unlink(missing_ok=True)


def write_text(target: str | os.PathLike, text: str) -> Path:
    """`Path.write_text` (UTF-8), atomically."""
    with replaced_file(target) as temporary:
        temporary.write_text(text, encoding="utf-8")
    return Path(target)


def write_lines(target: str | os.PathLike, lines: Iterable[str]) -> Path:
    """Each line followed by a newline, atomically: rewriting a JSONL file (a killed append's partial last line
    cut off, records past a resumed step dropped) never loses the records it keeps, whenever it is killed."""
    with replaced_file(target) as temporary, open(temporary, "w", encoding="utf-8", newline="\n") as file:
        for line in lines:
            file.write(line + "\n")
    return Path(target)


def write_array(target: str | os.PathLike, array: np.ndarray) -> Path:
    """`np.save(target, array)`, atomically (the name is kept as given: no `.npy` is added)."""
    array = np.ascontiguousarray(array)
    with replaced_file(target) as temporary, open(temporary, "wb") as file:
        np.lib.format.write_array_header_1_0(file, np.lib.format.header_data_from_array_1_0(array))
        append_array(file, array)
    return Path(target)


def append_array(file: BinaryIO, array: np.ndarray) -> None:
    """array's bytes at the end of an open file, as `ndarray.tofile` writes them. Not tofile (nor np.save, which
    calls it): given a file object it first asks whether it is os.PathLike, and a Ctrl-C that lands in that check
    comes out as a TypeError ("expected str, bytes or os.PathLike object"), a traceback instead of "interrupted"."""
    file.write(memoryview(np.ascontiguousarray(array)))


def current_umask() -> int:
    """This process's umask (reading it means setting it: set back at once)."""
    umask = os.umask(0o022)
    os.umask(umask)
    return umask


def flush_to_disk(path: Path) -> None:
    fsync_and_close(os.open(path, os.O_RDONLY))


def flush_folder(folder: Path) -> None:
    """fsync a folder's entries, so that a rename into or out of it survives a power cut (POSIX); skipped where
    a folder cannot be opened (Windows), which gives no way to ask for it."""
    try:
        descriptor = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    fsync_and_close(descriptor)


def fsync_and_close(descriptor: int) -> None:
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def flush_tree(folder: Path) -> None:
    """fsync every file under `folder`, then the folders themselves (their entries), deepest first."""
    for root, _, files in os.walk(folder, topdown=False):
        for name in files:
            flush_to_disk(Path(root) / name)
        flush_folder(Path(root))


def remove_stale_temporaries(folder: Path) -> None:
    """Delete the temp files and folders in `folder` whose writers are no longer alive."""
    try:
        entries = list(Path(folder).iterdir())
    except OSError:  # not there yet, or not readable: nothing to clean
        return
    for entry in entries:
        match = STALE_NAME.match(entry.name)
        if match and not process_alive(int(match.group(1))):
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)


def process_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by someone else
        return True
    except OSError:
        return True  # cannot tell (e.g. no kill on this platform): keep it
    return True
