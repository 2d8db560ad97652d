"""How a typed parameter is written on bertforge's command line.

jsonargparse derives each sub-command's options from the function's signature and docstring
(and a dataclass parameter's fields). Its own spellings are `--batch_size 8`, `--normalize true`
and `--vocab '[a, b]'`; bertforge's command line (the README, scripts, users' shell history) has
always had argparse's: `--batch-size 8`, `--normalize` / `--no-normalize`, `--vocab a b`, numbers
checked against `validation.BOUNDS` and choices listed in the error. `command_line_style` turns
the arguments jsonargparse adds into those forms; a type it does not know (a dict, a nested
dataclass) is left to jsonargparse.
"""
from __future__ import annotations

import argparse
import types
import typing
from typing import Any

from jsonargparse import ActionYesNo

from ..validation import BOUNDS


class BadOptionValue(argparse.ArgumentTypeError, ValueError):
    """A value an option cannot take. argparse reports an ArgumentTypeError's own words; jsonargparse,
    which checks values again (from a config file, say), reports a ValueError."""


class Bounded:
    """The argparse type of an int/float option: converts the word and checks the bound declared for `name`."""

    def __init__(self, kind: type, name: str):
        self.kind, self.bound = kind, BOUNDS.get(name)
        self.__name__ = kind.__name__  # argparse names the type by it in "invalid int value"

    def __call__(self, text):
        if text is None:  # the default of an `int | None` option, when jsonargparse checks it again
            return None
        try:
            value = self.kind(text)
        except (TypeError, ValueError):
            raise BadOptionValue(f"expected {'an integer' if self.kind is int else 'a number'}, got {text!r}") from None
        problem = self.bound.problem(value) if self.bound else None
        if problem:
            raise BadOptionValue(problem)
        return value

    def __str__(self) -> str:  # the help's "type: int, at least 1"
        return ", ".join(filter(None, (self.kind.__name__, str(self.bound or ""))))


def without_none(typehint) -> Any:
    """`X | None` -> X; anything else unchanged."""
    if typing.get_origin(typehint) in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(typehint) if a is not type(None)]
        if len(inner) == 1:
            return inner[0]
    return typehint


# One reader, two names in use: adapt's table options and index build's / embed's record fields name the same
# column of the same files (search/documents.py), so each command takes the other's spelling too.
OPTION_ALIASES = {"--text-column": "--text-field", "--text-field": "--text-column",
                  "--id-column": "--id-field", "--id-field": "--id-column"}


def command_line_style(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """jsonargparse's add_argument(*args, **kwargs) for a typed parameter, in bertforge's spelling.

    `--name_with_underscores` becomes `--name-with-underscores` (the dest keeps underscores);
    bool -> `--flag` / `--no-flag`; list[X] -> `--option a b` (nargs +); Literal -> choices;
    int / float -> a type that checks the bound declared for the name. Positional names stay.
    """
    action = kwargs.get("action")
    typehint = kwargs.get("type") if action is None else getattr(action, "_typehint", None)
    if typehint is None or not args:
        return args, kwargs  # not a parameter's argument (--debug, --config)
    name = args[0].lstrip("-")
    typehint = without_none(typehint)
    is_list = typing.get_origin(typehint) is list and len(typing.get_args(typehint)) == 1
    item = typing.get_args(typehint)[0] if is_list else typehint
    style = {key: value for key, value in kwargs.items() if key not in ("type", "action")}
    if item is bool and not is_list:
        style["action"] = ActionYesNo(no_prefix="no-")
    elif typing.get_origin(item) is typing.Literal:
        style["choices"] = typing.get_args(item)  # argparse lists them in the usage and in its error
    elif item in (int, float):
        style["type"] = Bounded(item, name)
    elif item is str:
        style["type"] = str
    else:
        return args, kwargs
    if is_list:
        style["nargs"] = "+"
    # jsonargparse also offers `--option+ value` to append to a list; `--option a b` replaces that.
    if not args[0].startswith("--"):
        return (name,), style
    option = "--" + name.replace("_", "-")
    return ((option, OPTION_ALIASES[option]) if option in OPTION_ALIASES else (option,)), style
