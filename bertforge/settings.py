"""Recipe files: YAML read into dataclasses, with `section.key=value` overrides from the command line."""
from __future__ import annotations

import dataclasses
import difflib
import typing
from pathlib import Path
from typing import Any

import yaml


def read_recipe(path: str | Path, overrides: list[str] = ()) -> dict[str, Any]:
    """The YAML mapping at `path`, with each `a.b.c=value` override applied (value parsed as YAML)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"recipe file {path} not found; see recipes/*.yaml for examples")
    try:
        values = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as error:
        raise ValueError(f"{path} is not valid YAML: {error}") from None
    if not isinstance(values, dict):
        raise ValueError(f"{path} must hold a mapping of sections (model, data, training, ...)")
    return apply_overrides(values, overrides)


def apply_overrides(values: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Set each `a.b.c=value` override (value parsed as YAML) in the nested mapping `values`."""
    for override in overrides:
        key, separator, text = override.partition("=")
        if not separator or not key:
            raise ValueError(f"override {override!r} must look like section.key=value, e.g. training.max_steps=100")
        *parents, leaf = key.split(".")
        node = values
        for parent in parents:
            node = node.setdefault(parent, {})
            if not isinstance(node, dict):
                raise ValueError(f"override {override!r}: {parent} is not a section")
        node[leaf] = yaml.safe_load(text)
    return values


def resolve(base: Path, path: str) -> str:
    """Paths in a recipe are relative to the recipe file, so recipes run from any directory."""
    return path if Path(path).is_absolute() else str((base / path).resolve())


def build(cls, values: dict[str, Any] | None, where: str):
    """Instantiate a (nested) dataclass from a mapping; unknown keys are errors with a suggestion."""
    values = dict(values or {})
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key in values:
        if key not in fields:
            close = difflib.get_close_matches(key, fields, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; known keys: {', '.join(fields)}"
            raise ValueError(f"unknown setting {where}.{key}{hint}")
    hints = typing.get_type_hints(cls)
    for key, value in values.items():
        if dataclasses.is_dataclass(hints[key]) and isinstance(value, dict):
            values[key] = build(hints[key], value, f"{where}.{key}")
    try:
        return cls(**values)
    except TypeError as error:
        raise ValueError(f"{where}: {error}") from None
