"""`python -m rayfl.algorithms`: write `rayfl/catalog_algorithms.py` from the built-in algorithms'
registrations (run it after adding or renaming one)."""

import sys

from .registry import LISTING, listing

LISTING.write_text(listing())
print(f"{LISTING}: written", file=sys.stderr)
