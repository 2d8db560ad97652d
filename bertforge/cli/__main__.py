"""`python -m bertforge.cli` (what torchrun runs): the same as the `bertforge` command."""
import sys

from . import main

sys.exit(main())
