"""`python -m rayfl` is the `rayfl` command."""

import sys

from rayfl.cli import main

sys.exit(main())
