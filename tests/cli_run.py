"""Run `bertforge` in-process and check that a failure is one clean line (shared by the reliability tests)."""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import io
import typing
from unittest import mock

from bertforge.cli import parser
from bertforge.cli.parser import COMMANDS, main


@functools.cache
def shared_parser(build=parser.build_parser) -> parser.CommandParser:
    """One parser for every in-process run: building it from the commands' signatures takes ~0.08 s of the
    CPU, two thirds of a hostile-file case in test_reliability_inputs.py (a process builds it once)."""
    return build()


def run_cli(*argv) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `bertforge ARGV`; a traceback would raise out of here and fail the test."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
            mock.patch.object(parser, "build_parser", shared_parser):
        code = main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


def assert_one_line_error(code: int, err: str, codes=(1, 2)) -> str:
    """The run failed cleanly: an expected exit code, and its last stderr line is the one error line."""
    lines = [line for line in err.splitlines() if line.strip()]
    assert code in codes, err
    assert "Traceback" not in err
    assert lines and lines[-1].startswith("bertforge") and ": error: " in lines[-1], err
    assert sum(": error: " in line for line in lines) == 1, err
    return lines[-1]


def command_options() -> list[tuple[list[str], str, object]]:
    """(command words, option name, type hint) for every option of every sub-command in COMMANDS;
    the fields of a dataclass parameter are options too."""
    found = []
    for name, entry in COMMANDS.items():
        for words, function in ([([name, inner], f) for inner, f in entry.items()] if isinstance(entry, dict)
                                else [([name], entry)]):
            hints = typing.get_type_hints(function)
            for parameter in inspect.signature(function).parameters.values():
                kind = hints.get(parameter.name)
                options = typing.get_type_hints(kind) if dataclasses.is_dataclass(kind) else {parameter.name: kind}
                found += [(words, option, hint) for option, hint in options.items()]
    return found
