"""`bertforge` on the command line: sub-commands derived from the typed functions in `commands`."""
from .parser import main

__all__ = ["main"]
