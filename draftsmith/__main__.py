"""`python -m draftsmith ...` (what torchrun launches) is the same as the `draftsmith` command."""
import sys

from draftsmith.cli import main

sys.exit(main())
