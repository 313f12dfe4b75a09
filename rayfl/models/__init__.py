"""Model families with width rate as a first-class argument (see `registry`)."""

from rayfl.models import cnn, cnn1d, cnn2, mlp  # noqa: F401  (registration)
from rayfl.models.registry import build_model, config_class, families

__all__ = ["build_model", "config_class", "families"]
