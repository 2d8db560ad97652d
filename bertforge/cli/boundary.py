"""The CLI's one error boundary: any exception a user's input or machine can cause -> one line and an exit code.

Exit codes: 2 the command line is wrong (argparse, out-of-range option values, unknown settings),
1 the data or the run failed (bad files, full disk, a model of the wrong kind), 130 interrupted.
Anything else is a bug in bertforge and keeps its traceback (as does every error under --debug).
"""
from __future__ import annotations

import errno
import io
import os
import re
import sys
import types

from ..errors import BertforgeError, UsageError
from ..input_files import not_utf8

USAGE, FAILED, INTERRUPTED = 2, 1, 130
TRAINING_COMMANDS = ("pretrain", "finetune", "readmission_train")  # the functions behind them

# What to do about an OSError, by errno; the file name and the system's words come first.
OS_HINTS = {
    errno.ENOENT: "check the path",
    errno.EISDIR: "it is a folder: give a file path",
    errno.ENOTDIR: "part of the path is a file, not a folder: give a folder path",
    errno.EEXIST: "it already exists as a file: give a folder path, or move the file",
    errno.EACCES: "no permission: choose a location you can use, or change its permissions",
    errno.EPERM: "not permitted: choose a location you can use, or change its permissions",
    errno.EROFS: "the file system is read-only: choose another output location",
    errno.ENOSPC: "the disk is full: free some space or choose another location",
    errno.EDQUOT: "the disk quota is used up: free some space or choose another location",
    errno.EFBIG: "the file is larger than this file system or the process's file size limit allows",
    errno.ENAMETOOLONG: "the name is too long for the file system",
    errno.EMFILE: "too many open files: raise the limit (ulimit -n)",
}


def describe(error: BaseException, command: str) -> tuple[str, int] | None:
    """(one-line message, exit code) for an error a user can cause; None for a bug (show the traceback)."""
    interrupt = interrupt_behind(error)
    if interrupt is not None:
        return (str(interrupt) if str(interrupt) else "interrupted"), INTERRUPTED
    if isinstance(error, UnicodeDecodeError):  # a ValueError too: it must come first
        return undecodable_input(error), FAILED
    if isinstance(error, UsageError):
        return str(error), USAGE
    if isinstance(error, (BertforgeError, ValueError)):
        return str(error), FAILED
    if isinstance(error, OSError):
        return os_problem(error, command), FAILED
    system = re.search(r"os error (\d+)", str(error))
    if type(error).__name__ == "SafetensorError" and system:  # safetensors' own wrapper of a failed write
        number = int(system.group(1))
        return os_problem(OSError(number, os.strerror(number)), command), FAILED
    if isinstance(error, MemoryError) or type(error).__name__ == "OutOfMemoryError":  # torch's, without importing it
        return "out of memory: lower --batch-size (or the recipe's batch_size / max_length)", FAILED
    return None


def interrupt_behind(error: BaseException) -> KeyboardInterrupt | None:
    """The Ctrl-C `error` is or came from, through its causes and contexts; None where there is none.

    A library that is interrupted half-way can fail in its own words while handling the Ctrl-C: torch.onnx.export
    stopped while it imports torch._dynamo raises "TorchExportError: ... partially initialized module
    'torch._dynamo' has no attribute 'decorators'", the Ctrl-C two links down its chain. It is still a Ctrl-C."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, KeyboardInterrupt):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


def os_problem(error: OSError, command: str) -> str:
    where = " -> ".join(str(name) for name in (error.filename, error.filename2) if name is not None)
    what = error.strerror or str(error)
    hint = OS_HINTS.get(error.errno, "")
    message = f"{where}: {what}" if where else what
    if hint:
        message += f"; {hint}"
    if command in TRAINING_COMMANDS and error.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        message += "; checkpoints already saved are intact: run the same command with --resume to continue"
    return message


def undecodable_input(error: UnicodeDecodeError) -> str:
    """Name the file being read and the line of its first non-UTF-8 byte.

    A UnicodeDecodeError does not know its file; the open file object does, and it is a local of
    a frame of the traceback (the reader's `for line in file`, pathlib's read_text, csv's reader).
    """
    name = file_being_read(error.__traceback__)
    if name is None:
        return f"the input is not UTF-8 text ({error.reason}); convert it, e.g. iconv -f latin1 -t utf-8"
    return not_utf8(name)


def file_being_read(trace: types.TracebackType | None) -> str | None:
    frames = []
    while trace is not None:
        frames.append(trace.tb_frame)
        trace = trace.tb_next
    for frame in reversed(frames):  # innermost first: the file whose bytes failed
        for value in frame.f_locals.values():
            if isinstance(value, io.TextIOBase) and isinstance(getattr(value, "name", None), str):
                return value.name  # a .gz file's text wrapper answers with the GzipFile's name too
    return None


def report(message: str, code: int) -> int:
    print(f"bertforge: error: {message}" if code != INTERRUPTED else f"bertforge: {message}", file=sys.stderr)
    if code == INTERRUPTED:
        forget_unhandled_interrupt()
    return code


def forget_unhandled_interrupt() -> None:
    """Tell CPython the Ctrl-C was handled. A KeyboardInterrupt that ends code run by exec() or eval() of a string
    (dataclasses and namedtuple make their methods that way while modules load) marks it unhandled even when it is
    caught further up, and the interpreter then kills itself with SIGINT at exit: a parent saw -2, not 130."""
    try:
        import ctypes

        ctypes.c_int.in_dll(ctypes.pythonapi, "_Py_UnhandledKeyboardInterrupt").value = 0
    except (ImportError, ValueError, AttributeError):  # not CPython, or a build that does not export the flag
        pass
