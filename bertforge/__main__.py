"""`python -m bertforge`: the same as the `bertforge` command (and `python -m bertforge.cli`, what torchrun runs)."""
import sys

from .cli import main

sys.exit(main())
