"""Write files and folders so that readers see the old version or the new one, never half of one.

Everything is written beside its target first (same file system, so publishing is a rename)
and renamed into place only when complete, after an fsync (a power cut after the rename cannot
leave an empty file); after an error the partial copy is removed. A process killed with SIGKILL
cannot remove its own leftovers, so temp names carry the writer's pid and the next writer of
the same target removes leftovers of writers that are no longer alive.
"""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

TEMP_MARK = ".tmp-"  # .{name}.tmp-{pid}-{random}: hidden, and says whose it is
STALE_NAME = re.compile(rf"^\..+{re.escape(TEMP_MARK)}(\d+)-")


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
def replaced_file(target: str | os.PathLike) -> Iterator[Path]:
    """A temp path beside `target` to write; on success it replaces `target` in one rename.

    The temp path ends with the target's suffix (np.save and savefig pick the format from it).
    Missing parent folders are made; after an error the temp file is removed and `target`
    is left as it was.
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
    finally:
        temporary.unlink(missing_ok=True)


def write_text(target: str | os.PathLike, text: str) -> Path:
    """`Path.write_text` (UTF-8), atomically."""
    with replaced_file(target) as temporary:
        temporary.write_text(text, encoding="utf-8")
    return Path(target)


def current_umask() -> int:
    """This process's umask (reading it means setting it: set back at once)."""
    umask = os.umask(0o022)
    os.umask(umask)
    return umask


def flush_to_disk(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


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
