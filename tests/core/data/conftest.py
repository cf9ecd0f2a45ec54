"""Shared fixtures of the core.data tests: a tiny byte-level tokenizer and loader arguments."""

import pytest

from tests.tiny_models import byte_level_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return byte_level_tokenizer()


@pytest.fixture
def cfg(tmp_path_factory):
    """Keyword arguments of the loaders (default source: the bundled GSM8K), with a private datasets cache."""
    cache = str(tmp_path_factory.getbasetemp() / "datasets-cache")

    def make(**kwargs):
        kwargs.setdefault("source", "gsm8k-test")
        kwargs.setdefault("cache_dir", cache)
        return kwargs

    return make
