"""Write files and folders so that readers see the old version or the new one, never half of one.

Everything is written beside its target first (same file system, so publishing is a rename)
and renamed into place only when complete; after an error the partial copy is removed.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator


@contextlib.contextmanager
def staging_folder(target: Path) -> Iterator[Path]:
    """A hidden temp folder beside `target` to write into before publishing; removed on exit.

    What the caller did not move out (after an error, say) is deleted, so no half-written
    folder stays.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        yield staging
    finally:
        shutil.rmtree(staging, ignore_errors=True)


@contextlib.contextmanager
def replaced_file(target: str | os.PathLike) -> Iterator[Path]:
    """A temp path beside `target` to write; on success it replaces `target` in one rename.

    Missing parent folders are made; after an error the temp file is removed and `target`
    is left as it was.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = target.with_name(f".{target.name}.tmp")
    try:
        yield temporary
        os.replace(temporary, target)
    finally:
        temporary.unlink(missing_ok=True)
