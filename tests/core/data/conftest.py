"""Shared fixtures of the core.data tests: a tiny byte-level tokenizer and loader arguments."""

import pytest

from core.data import ALPACA_PROMPT_NO_INPUT, ALPACA_PROMPT_WITH_INPUT


def byte_level_tokenizer():
    """A tiny byte-level BPE tokenizer (every string round-trips), trained in well under a second."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=["<pad>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = [ALPACA_PROMPT_WITH_INPUT, ALPACA_PROMPT_NO_INPUT, "The answer is 42. How many eggs does she sell?"]
    tok.train_from_iterator(corpus * 20, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>")

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
