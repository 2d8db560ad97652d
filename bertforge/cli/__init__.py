"""`bertforge` on the command line: sub-commands derived from the typed functions in `commands`."""
from __future__ import annotations

from .boundary import describe, report  # light (14 ms), so the guard below covers the rest


def main(argv: list[str] | None = None) -> int:
    """The `bertforge` command. Reading the command line takes about half a second (the commands' modules and the
    parser built from them); a Ctrl-C in that time ends as one line, as it does while a command runs."""
    try:
        from .parser import main as run
    except KeyboardInterrupt as error:
        return report(*describe(error, "bertforge"))
    return run(argv)


__all__ = ["main"]
