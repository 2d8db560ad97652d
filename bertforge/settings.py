"""Recipe files: YAML read into dataclasses, with command-line flags and `section.key=value` overrides.

Numbers are read the way people write them: PyYAML follows YAML 1.1, where `3e-5` (no dot) is
a string, so the README's own `training.learning_rate=3e-5` reached AdamW as text. The loader
here also reads YAML 1.2's exponent floats, and `build` converts every value to its field's
declared type (a quoted "5" for an int, 1000.0 for an int) or fails naming the key and the type.
"""
from __future__ import annotations

import dataclasses
import difflib
import math
import re
import types
import typing
from pathlib import Path
from typing import Any

import yaml

from .errors import UsageError
from .validation import check_value


class RecipeLoader(yaml.SafeLoader):
    """safe_load plus YAML 1.2 floats: 3e-5, 1E+3, -2e4 (YAML 1.1 wants a dot before the exponent)."""


RecipeLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"))


def parse_value(text: str, where: str) -> Any:
    """One YAML value, as a recipe file would read it."""
    try:
        return yaml.load(text, Loader=RecipeLoader)
    except yaml.YAMLError as error:
        raise UsageError(f"{where}: {text!r} is not a valid YAML value ({problem_line(error)}); "
                         "quote strings, write lists as [a, b]") from None


def problem_line(error: yaml.YAMLError) -> str:
    """The first line of a YAML error, with its position: PyYAML's own message spans several lines."""
    mark = getattr(error, "problem_mark", None)
    problem = getattr(error, "problem", None) or str(error).splitlines()[0]
    return f"{problem} at line {mark.line + 1}, column {mark.column + 1}" if mark else problem


def read_recipe(path: str | Path, overrides: list[str] = ()) -> dict[str, Any]:
    """The YAML mapping at `path`, with each `a.b.c=value` override applied (value parsed as YAML)."""
    path = Path(path)
    if path.is_dir():
        raise UsageError(f"recipe {path} is a folder; pass a .yaml file (see recipes/*.yaml)")
    if not path.is_file():
        raise UsageError(f"recipe file {path} not found; see recipes/*.yaml for examples")
    try:
        values = yaml.load(path.read_text(encoding="utf-8"), Loader=RecipeLoader) or {}
    except yaml.YAMLError as error:
        raise UsageError(f"{path} is not valid YAML: {problem_line(error)}") from None
    if not isinstance(values, dict):
        raise UsageError(f"{path} must hold a mapping of sections (model, data, training, ...)")
    return apply_overrides(values, overrides)


def apply_overrides(values: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Set each `a.b.c=value` override (value parsed as YAML) in the nested mapping `values`."""
    for override in overrides:
        key, separator, text = override.partition("=")
        if not separator or not key:
            raise UsageError(f"override {override!r} must look like section.key=value, e.g. training.max_steps=100")
        set_setting(values, key, parse_value(text, f"override {key}"), f"override {override!r}")
    return values


def command_line_recipe(config: str | Path | None, flags: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """The recipe mapping a command runs: the YAML file `config` (or none), then each flag that was given
    (not None) at its dotted key, e.g. {"data.train": "x.csv"}, then the `key=value` overrides; later wins."""
    values = read_recipe(config) if config else {}
    for key, value in flags.items():
        if value is not None:
            set_setting(values, key, value, f"setting {key}")
    return apply_overrides(values, overrides)


def set_setting(values: dict[str, Any], key: str, value: Any, where: str) -> None:
    """Set the dotted `key` in the nested mapping `values`, making the sections it names.

    Raises UsageError naming `where` when a section on the way is a plain value.
    """
    *parents, leaf = key.split(".")
    node = values
    for parent in parents:
        node = node.setdefault(parent, {})
        if not isinstance(node, dict):
            raise UsageError(f"{where}: {parent} is not a section")
    node[leaf] = value


def recipe_yaml(recipe) -> str:
    """A recipe dataclass (or a mapping of them) as YAML that `--config` reads back: every setting, defaults included."""
    values = dataclasses.asdict(recipe) if dataclasses.is_dataclass(recipe) else \
        {key: dataclasses.asdict(value) for key, value in recipe.items()}
    return yaml.safe_dump(values, sort_keys=False, allow_unicode=True)


def resolve(base: Path, path: str) -> str:
    """Paths in a recipe are relative to the recipe file, so recipes run from any directory."""
    return path if Path(path).is_absolute() else str((base / path).resolve())


def build_run_recipe(cls, values: dict[str, Any], training_defaults, base: Path):
    """A fine-tuning-style recipe (finetune, sbert): its `training` section laid over the task's
    `training_defaults`, and its data.train/dev/test paths made relative to `base` (the recipe's folder)."""
    recipe = build(cls, over_defaults(values, "training", training_defaults), "recipe")
    for name in ("train", "dev", "test"):
        if getattr(recipe.data, name):
            setattr(recipe.data, name, resolve(base, getattr(recipe.data, name)))
    return recipe


def over_defaults(values: dict[str, Any], section: str, defaults) -> dict[str, Any]:
    """`values` with its `section` laid over the dataclass instance `defaults` (e.g. a recipe's
    training settings over the task's defaults); raises UsageError when the section is not a mapping."""
    given = values.get(section) or {}
    if not isinstance(given, dict):
        raise UsageError(f"recipe.{section} must be a section of key: value settings, got {given!r}")
    return {**values, section: {**dataclasses.asdict(defaults), **given}}


def build(cls, values: dict[str, Any] | None, where: str):
    """Instantiate a (nested) dataclass from a mapping.

    Values are converted to the fields' declared types and checked against `validation.BOUNDS`;
    unknown keys, wrong types and out-of-range numbers raise UsageError naming `where.key`.
    """
    if values is not None and not isinstance(values, dict):
        raise UsageError(f"{where} must be a section of key: value settings, got {values!r}")
    values = dict(values or {})
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key in values:
        if key not in fields:
            close = difflib.get_close_matches(key, fields, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; known keys: {', '.join(fields)}"
            raise UsageError(f"unknown setting {where}.{key}{hint}")
    hints = typing.get_type_hints(cls)
    for key, value in values.items():
        values[key] = convert(value, hints[key], f"{where}.{key}")
        check_value(key, values[key], f"{where}.")
    try:
        return cls(**values)
    except TypeError as error:
        raise UsageError(f"{where}: {error}") from None


def convert(value: Any, kind, where: str) -> Any:
    """`value` as the type `kind` (int, float, bool, str, Literal, list[str], dict, Optional, a dataclass).

    Raises UsageError naming `where` and the expected type when it cannot be converted.
    """
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1:
            return convert(value, inner[0], where)
        return value  # a genuine union (e.g. int | str): the dataclass checks it
    if dataclasses.is_dataclass(kind):
        return value if isinstance(value, kind) else build(kind, value, where)
    if origin is typing.Literal:
        if any(value == choice and type(value) is type(choice) for choice in args):
            return value
        raise UsageError(f"{where} must be one of {', '.join(map(str, args))}, got {value!r}")
    if kind is bool:
        if isinstance(value, bool):
            return value
        raise UsageError(f"{where} must be true or false, got {value!r}")
    if kind in (int, float):
        return to_number(value, kind, where)
    if kind is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)  # a column or folder named 2024 reads as a number in YAML
        raise UsageError(f"{where} must be a string, got {value!r}")
    if origin is list:
        items = value if isinstance(value, list) else [value]  # `data.train=one.txt`: a list of one
        return [convert(item, args[0], f"{where}[{i}]") for i, item in enumerate(items)] if args else items
    if origin is dict or kind is dict:
        if not isinstance(value, dict):
            raise UsageError(f"{where} must be a section of key: value settings, got {value!r}")
        return value
    return value


def to_number(value: Any, kind: type, where: str) -> int | float:
    """An int or float setting from a YAML number or a string that spells one (3e-5, 1_000, "0.1")."""
    name = "an integer" if kind is int else "a number"
    number = value
    if isinstance(value, str):
        try:
            number = float(value.replace("_", "")) if kind is float or not value.strip().lstrip("+-").isdigit() \
                else int(value.replace("_", ""))
        except ValueError:
            raise UsageError(f"{where} must be {name}, got {value!r}") from None
    if isinstance(number, bool) or not isinstance(number, (int, float)):
        raise UsageError(f"{where} must be {name}, got {value!r}")
    if not math.isfinite(number):
        raise UsageError(f"{where} must be a finite number, got {value!r}")
    if kind is int:
        if number != int(number):
            raise UsageError(f"{where} must be {name}, got {value!r}")
        return int(number)
    return float(number)
