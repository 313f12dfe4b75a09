"""`python -m rayfl.algorithms`: write `rayfl/catalog_builtin.py` from the registrations of rayfl's
own datasets, model families and algorithms, and in a checkout the table of `docs/algorithms.md`
(run it after adding, renaming or describing one)."""

import sys

from .registry import LISTING, PAGE, listing, with_table

LISTING.write_text(listing())
print(f"{LISTING}: written", file=sys.stderr)
if PAGE.is_file():
    PAGE.write_text(with_table(PAGE.read_text()))
    print(f"{PAGE}: table written", file=sys.stderr)
