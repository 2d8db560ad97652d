"""Run `bertforge` in-process and check that a failure is one clean line (shared by the reliability tests)."""
from __future__ import annotations

import contextlib
import io

from bertforge.cli.parser import main


def run_cli(*argv) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `bertforge ARGV`; a traceback would raise out of here and fail the test."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
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
