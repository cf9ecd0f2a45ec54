"""Fixtures and hooks of the whole suite: offline hub access, a module's workspace and tiny-test run, and
the skip of `gpu`-marked tests where there is no CUDA device."""

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


def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu`` need a CUDA device: where torch sees none they are skipped, and the
    summary (``-ra``) lists them with the reason."""
    needs_gpu = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not needs_gpu:
        return
    import torch  # only when gpu tests were collected: the job and app tests stay torch-free

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (torch.cuda.is_available() is False)")
    for item in needs_gpu:
        item.add_marker(skip)
