"""Fixtures of the whole suite: offline hub access, a module's workspace and tiny-test run."""

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    """A workspace shared by the tests of one module; the models its runs need are cached in it on first use."""
    return tmp_path_factory.mktemp("ws")


@pytest.fixture(scope="module")
def tiny_run(workspace) -> Path:
    """A finished tiny-test conversion in the module's workspace (``runs/tiny``)."""
    from tests.tiny_runs import convert_tiny  # torch loads here, not in every test process

    return convert_tiny(workspace)[0]

