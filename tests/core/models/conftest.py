"""Fixtures of the core.models tests."""

import pytest

from tests.core.models.folders import save_tiny_llama


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-llama")
    model = save_tiny_llama(folder)
    return folder, model
