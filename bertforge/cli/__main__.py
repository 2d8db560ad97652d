"""`python -m bertforge.cli` (what torchrun runs): the same as the `bertforge` command."""
import sys

from .parser import main

sys.exit(main())
