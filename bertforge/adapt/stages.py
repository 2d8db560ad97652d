"""adapt's output folder and its stage cache: each stage's results live under a hash of what made them.

    DIR/adapt.json                     marks the folder as adapt's (another program's folder is never written in)
    DIR/stages/<name>-<key>/           one stage's work: the run (checkpoints: a kill resumes it) and model
    DIR/stages/<name>-<key>/done.json  written last, whole: the stage is finished; its metrics

A stage's key hashes its name, its settings and the keys of what it stands on (the corpus's
content, the base model, the stage before it), so changing any of them gives a new key and
the stage (and every one after it) runs again, while an unchanged stage is read back.
"""
from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from ..atomic import write_text
from ..errors import UsageError

MARKER = "adapt.json"
STAGES = "stages"
DONE = "done.json"


def base_system(systems: list[dict | None]) -> dict:
    """The base model's record among a run's stage records (None, a stage another process recorded, skipped)."""
    return next(s for s in systems if s and s["name"] == "base")


def stage_key(*parts) -> str:
    """12 hex digits of sha256 over the parts' JSON (dataclasses as their dicts, paths as strings)."""
    text = json.dumps(parts, sort_keys=True, default=lambda value: getattr(value, "__dict__", str(value)))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


def claim_output(folder: Path, description: dict) -> None:
    """Make `folder` adapt's, or check that it already is; raises UsageError for anyone else's folder."""
    marker = folder / MARKER
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"--output {folder} is a file; give a folder for adapt's model, index and report")
    if folder.is_dir() and any(folder.iterdir()) and not marker.is_file():
        raise UsageError(f"--output {folder} holds files adapt did not write; give a new or empty folder "
                         "(adapt only resumes its own runs there)")
    folder.mkdir(parents=True, exist_ok=True)
    write_text(marker, json.dumps(description, indent=2) + "\n")


@dataclass
class Stage:
    """One cached stage in DIR/stages/<name>-<key>."""

    name: str
    key: str
    folder: Path

    @classmethod
    def of(cls, output: Path, name: str, *parts) -> "Stage":
        key = stage_key(name, *parts)
        return cls(name, key, output / STAGES / f"{name}-{key}")

    @property
    def done(self) -> dict | None:
        """The finished stage's record, or None while it has not finished."""
        path = self.folder / DONE
        return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None

    def finish(self, record: dict) -> dict:
        self.folder.mkdir(parents=True, exist_ok=True)
        write_text(self.folder / DONE, json.dumps(record, indent=2) + "\n")
        return record

    @property
    def model(self) -> Path:
        return self.folder / "model"

    @property
    def run(self) -> Path:
        return self.folder / "run"


def remove_stale(output: Path, current: list[Stage]) -> list[str]:
    """Delete stage folders no current stage uses (made for another corpus or settings); their names."""
    keep = {stage.folder.name for stage in current}
    removed = []
    for folder in sorted((output / STAGES).glob("*")) if (output / STAGES).is_dir() else []:
        if folder.is_dir() and folder.name not in keep:
            shutil.rmtree(folder)
            removed.append(folder.name)
    return removed
