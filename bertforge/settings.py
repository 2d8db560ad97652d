"""Recipe files: YAML read into dataclasses, with command-line flags and `section.key=value` overrides.

`load_recipe` is the one way a command loads a recipe (pretrain, finetune, baseline, sbert train):
file, then flags, then overrides; `build` checks every key (an unknown one is refused naming the
nearest, `refuse_unknown`), type and bound; `resolve_paths` gives every path one rule (the file's
folder for paths written in it, the working folder for the command line and defaults).

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


PATH_KIND = "recipe_path"
PATH = {PATH_KIND: "file"}  # field metadata: a file or folder path (see resolve_paths)
CHECKPOINT = {PATH_KIND: "checkpoint"}  # field metadata: a checkpoint folder, or a short name / hub id
KEYS_OF = "keys_of"  # field metadata of a dict setting: {KEYS_OF: a dataclass whose fields are its keys}


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


def read_recipe(path: str | Path) -> dict[str, Any]:
    """The YAML mapping at `path` (a recipe file); UsageError in one line when it is missing or not a mapping."""
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
    return values


def apply_overrides(values: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Set each `a.b.c=value` override (value parsed as YAML) in the nested mapping `values`."""
    for override in overrides:
        key, separator, text = override.partition("=")
        if not separator or not key:
            raise UsageError(f"override {override!r} must look like section.key=value, e.g. training.max_steps=100")
        set_setting(values, key, parse_value(text, f"override {key}"), f"override {override!r}")
    return values


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
    """A recipe dataclass (or a mapping of them, or of plain values) as YAML that `--config` reads back: every
    setting, defaults included."""
    values = dataclasses.asdict(recipe) if dataclasses.is_dataclass(recipe) else \
        {key: dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value for key, value in recipe.items()}
    return yaml.safe_dump(values, sort_keys=False, allow_unicode=True)


def load_recipe(cls, config: str | Path | None = None, flags: dict[str, Any] | None = None,
                overrides: list[str] = ()):
    """The recipe a command runs: the YAML file `config` (or none), then each flag that was given
    (not None) at its dotted key, e.g. {"data.train": "x.csv"}, then the `key=value` overrides; later wins.

    Paths follow one rule (`resolve_paths`): those written in the file are relative to the file's
    folder, those given on the command line (flags, overrides) and the defaults to the working folder.
    Raises UsageError naming the key for an unknown key, a wrong type or an out-of-range value.
    """
    values = read_recipe(config) if config else {}
    if config:
        resolve_paths(cls, values, Path(config).resolve().parent)
    for key, value in (flags or {}).items():
        if value is not None:
            set_setting(values, key, value, f"setting {key}")
    return recipe_from_values(cls, apply_overrides(values, list(overrides)), Path.cwd())


def recipe_from_values(cls, values: dict[str, Any], base: Path = Path(".")):
    """A recipe dataclass from a (YAML-shaped) mapping whose relative paths are relative to `base`."""
    values = dict(values)
    resolve_paths(cls, values, base)
    recipe = build(cls, values, "recipe")
    resolve_paths(cls, vars(recipe), Path.cwd())  # the defaults' paths (runs/finetune, ...)
    return recipe


def resolve_paths(cls, values: dict[str, Any], base: Path) -> None:
    """Make every path setting in `values` (a mapping shaped like the dataclass `cls`, or an instance's
    vars()) absolute against `base`, in place; paths are the fields whose metadata is PATH or CHECKPOINT.

    Absolute, a printed recipe (`--print-config`) runs the same from any folder. Keys `cls` does not
    know and values of the wrong type are left for `build` to refuse.
    """
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key, value in values.items():
        field = fields.get(key)
        kind = field and field.metadata.get(PATH_KIND)
        if kind:
            values[key] = [resolve(base, v, kind) for v in value] if isinstance(value, list) else \
                resolve(base, value, kind)
        elif field and dataclasses.is_dataclass(value):
            resolve_paths(type(value), vars(value), base)
        elif field and isinstance(value, dict) and dataclasses.is_dataclass(section := field_class(cls, key)):
            resolve_paths(section, value, base)


def resolve(base: Path, path: Any, kind: str = "file") -> Any:
    """`path` made absolute against `base` (a leading ~ is the home folder); empty or non-text values stay.

    A CHECKPOINT that is no folder under `base` stays as written: a packaged short name (minilm) or
    a Hugging Face hub id, resolved where the checkpoint is loaded.
    """
    if not isinstance(path, str) or not path:
        return path
    candidate = base / Path(path).expanduser()
    if kind == "checkpoint" and not candidate.exists():
        return path
    return str(candidate.resolve())


def field_class(cls, name: str):
    """The declared type of `cls`'s field `name`, without `| None`."""
    kind = typing.get_type_hints(cls)[name]
    inner = [a for a in typing.get_args(kind) if a is not type(None)]
    return inner[0] if typing.get_origin(kind) in (typing.Union, types.UnionType) and len(inner) == 1 else kind


def build(cls, values: dict[str, Any] | None, where: str):
    """Instantiate a (nested) dataclass from a mapping.

    Values are converted to the fields' declared types and checked against `validation.BOUNDS`;
    unknown keys, wrong types and out-of-range numbers raise UsageError naming `where.key`.
    A section given in part is laid over its field's default (a recipe's `training` over the
    task's training defaults, not TrainConfig's).
    """
    if values is not None and not isinstance(values, dict):
        raise UsageError(f"{where} must be a section of key: value settings, got {values!r}")
    values = checked_settings(cls, over_default_sections(cls, dict(values or {})), where)
    try:
        return cls(**values)
    except TypeError as error:
        raise UsageError(f"{where}: {error}") from None


def over_default_sections(cls, values: dict[str, Any]) -> dict[str, Any]:
    """`values` with each section (a mapping for a dataclass field) laid over that field's default instance."""
    for field in dataclasses.fields(cls):
        given = values.get(field.name)
        if field.name in values and given is None:  # `training:` with every key commented out: the defaults
            given = {}
        if isinstance(given, dict) and field.default_factory is not dataclasses.MISSING:
            default = field.default_factory()
            if dataclasses.is_dataclass(default):
                values[field.name] = {**{f.name: getattr(default, f.name) for f in dataclasses.fields(default)
                                         if f.init}, **given}
    return values


def checked_settings(cls, values: dict[str, Any], where: str) -> dict[str, Any]:
    """`values` converted to the types of the dataclass `cls`'s fields and checked against their bounds.

    The one rule for keys: one `cls` does not declare is refused, naming the nearest one. A dict
    field whose metadata names KEYS_OF (model overrides: BertConfig's fields) is checked the same way.
    """
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    refuse_unknown(values, fields, where)
    hints = typing.get_type_hints(cls)
    for key, value in values.items():
        values[key] = convert(value, hints[key], f"{where}.{key}")
        check_value(key, values[key], f"{where}.")
        if KEYS_OF in fields[key].metadata and isinstance(values[key], dict):
            values[key] = checked_settings(fields[key].metadata[KEYS_OF], dict(values[key]), f"{where}.{key}")
    return values


def refuse_unknown(keys, known, where: str) -> None:
    """UsageError for the first of `keys` not among `known`, naming the nearest known key (difflib)."""
    for key in keys:
        if key not in known:
            close = difflib.get_close_matches(str(key), list(known), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; known keys: {', '.join(known)}"
            raise UsageError(f"unknown setting {where}.{key}{hint}")


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
