"""`python -m rayfl` is the `rayfl` command."""

import sys

from .cli import main

sys.exit(main())
