"""Algorithms: one module (or package) each, server policy + client procedure, registered by
name when imported (`registry`). Importing this package imports every module in it, so a new
algorithm is one new file; algorithms of other packages register through the entry point group
`rayfl.algorithms` (`registry.PLUGINS`)."""

import importlib
import pkgutil

from . import registry

for _module in pkgutil.walk_packages(__path__, __name__ + "."):
    if not _module.name.endswith(".__main__"):  # `python -m rayfl.algorithms` writes the catalog
        importlib.import_module(_module.name)

__all__ = ["registry"]
