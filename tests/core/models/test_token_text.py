"""core.models.token_text: what each token reads as, with the bundled byte-level BPE tokenizer
(SmolLM2) and the bundled SentencePiece tokenizer with byte fallback (Gemma 3), read from their GGUFs."""

import re

import pytest

from core.models import GEMMA3_MODEL, bundled_tokenizer
from core.models.token_text import token_texts

PROMPT = "猫は🐈 sat on the mat"
BYTE = re.compile(r"<0x([0-9A-F]{2})>")


def as_bytes(text: str) -> bytes:
    """``text`` with each ``<0xNN>`` turned back into its byte."""
    parts = BYTE.split(text)  # text, hex digits, text, ...
    return b"".join(bytes([int(p, 16)]) if i % 2 else p.encode() for i, p in enumerate(parts))


def texts_of(tokenizer, text: str) -> list[str]:
    return token_texts(tokenizer, tokenizer(text)["input_ids"])


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    return bundled_tokenizer(tmp_path_factory.mktemp("workspace"))


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    return bundled_tokenizer(tmp_path_factory.mktemp("workspace"), GEMMA3_MODEL)


def test_byte_level_tokens_read_as_their_characters_and_split_bytes(smollm2):
    texts = texts_of(smollm2, PROMPT)
    # 猫 (3 bytes), は (3) and 🐈 (4) are each split across tokens: only their bytes can be shown
    assert texts == ["<0xE7>", "<0x8C>", "<0xAB>", "<0xE3><0x81>", "<0xAF>", "<0xF0><0x9F>", "<0x90>", "<0x88>",
                     " sat", " on", " the", " mat"]
    assert as_bytes("".join(texts)) == PROMPT.encode()
    assert not any(symbol in text for text in texts for symbol in "çãðĠĮ«¯ŁĲĪ")  # no byte-level BPE symbols
    assert texts_of(smollm2, "naïve café 🐈\nmat") == ["na", "ïve", " café", " <0xF0><0x9F>", "<0x90>", "<0x88>",
                                                       "\n", "mat"]


def test_special_tokens_and_invalid_bytes(smollm2):
    assert texts_of(smollm2, "<|im_start|>user\nHi<|im_end|>") == ["<|im_start|>", "user", "\n", "Hi", "<|im_end|>"]
    # a generated sequence may break off a character: its lead byte stays a byte, the next token its text
    assert token_texts(smollm2, smollm2.convert_tokens_to_ids(["ç", "Į", "Ġthe"])) == ["<0xE7>", "<0x8C>", " the"]


@pytest.mark.slow
def test_sentencepiece_tokens_read_as_their_characters_and_fallback_bytes(gemma):
    texts = texts_of(gemma, PROMPT)
    assert texts == ["<bos>", "猫", "は", "🐈", " sat", " on", " the", " mat"]
    fallback = texts_of(gemma, "🫨 sat")  # not in the vocabulary: four byte-fallback tokens
    assert fallback == ["<bos>", "<0xF0>", "<0x9F>", "<0xAB>", "<0xA8>", " sat"]
    assert as_bytes("".join(fallback)) == "<bos>🫨 sat".encode()
    # a real U+FFFD in the text is a character, not an undecodable byte
    assert texts_of(gemma, "ok \ufffd ok") == ["<bos>", "ok", " \ufffd", " ok"]
