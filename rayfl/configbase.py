"""The base of every config section, and the error bad input raises (`rayfl.config` re-exports both)."""

from pydantic import BaseModel, ConfigDict


class ConfigError(ValueError):
    """Bad user input: a one-line message naming the key, file or value at fault."""


class Strict(BaseModel):
    """Base of every config section: unknown keys are errors, instances are frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)
