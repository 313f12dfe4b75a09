"""Shared fixtures: datasets are loaded once per session."""

import pytest

from rayfl.config import parse_config
from rayfl.data import load_dataset


@pytest.fixture(scope="session")
def digits():
    return load_dataset(parse_config({}).data, seed=0)
