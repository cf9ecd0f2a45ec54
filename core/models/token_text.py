"""What each token of a sequence reads as: the per-token text that token views (heatmap axes) show.

    from core.models.token_text import token_texts
    token_texts(tokenizer, tokenizer("é🐈 sat")["input_ids"])
    # byte-level BPE (SmolLM2): ['é', '<0xF0><0x9F>', '<0x90>', '<0x88>', ' sat']

Contract of :func:`token_texts`: one string per id, the characters that the token's bytes form, spaces
and newlines as they are, special tokens as their text. A byte that forms no character within its
token (part of a character whose bytes are split across tokens, or an invalid UTF-8 byte) is written
``<0xNN>`` (two upper-case hex digits). Nothing is lost: with each ``<0xNN>`` turned back into its byte,
the texts joined are the bytes of the decoded sequence.

Written here because neither transformers nor tokenizers gives a token's bytes: ``decode`` turns a
partial character into U+FFFD, and ``convert_ids_to_tokens`` gives vocabulary symbols (byte-level
BPE's ``ç``, ``Ġ``; SentencePiece's ``▁``). The bytes come from a token's symbol where it spells them
(SentencePiece byte-fallback pieces ``<0xNN>``; byte-level BPE pieces through GPT-2's byte alphabet)
and the tokenizer's own decoding of that token agrees; any other token holds whole characters, and
its text is what it adds to the decoded prefix before it (so the tokenizer's spacing rules apply).
Torch-free: it only calls the tokenizer.
"""

from __future__ import annotations

import functools
import re
from typing import Any, Sequence

_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # a SentencePiece byte-fallback token
_ESCAPED_BYTE = re.compile("[\udc80-\udcff]")  # how errors="surrogateescape" decodes an undecodable byte
_DECODE = {"skip_special_tokens": False, "clean_up_tokenization_spaces": False}


@functools.cache
def _byte_level_alphabet() -> dict[str, int]:
    """Byte-level BPE's symbol -> byte table (GPT-2's, which every byte-level tokenizer uses)."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return {symbol: byte for byte, symbol in bytes_to_unicode().items()}


def _spelled_bytes(piece: str) -> bytes | None:
    """The bytes ``piece`` spells as a byte-fallback token or in the byte-level alphabet, else None."""
    match = _BYTE_PIECE.fullmatch(piece)
    if match:
        return bytes([int(match[1], 16)])
    alphabet = _byte_level_alphabet()
    if piece and all(symbol in alphabet for symbol in piece):
        return bytes(alphabet[symbol] for symbol in piece)
    return None


def _bytes_text(data: bytes) -> str:
    """``data`` decoded as UTF-8, each byte that forms no character written ``<0xNN>``."""
    text = data.decode("utf-8", errors="surrogateescape")
    return _ESCAPED_BYTE.sub(lambda m: f"<0x{ord(m[0]) - 0xDC00:02X}>", text)


def token_texts(tokenizer: Any, ids: Sequence[int]) -> list[str]:
    """One string per id of ``ids`` (a Hugging Face tokenizer's): the characters the token's bytes form,
    each byte that forms no character within the token written ``<0xNN>`` (see the module docstring)."""
    ids = [int(i) for i in ids]
    pieces = tokenizer.convert_ids_to_tokens(ids)
    alone = tokenizer.batch_decode([[i] for i in ids], **_DECODE)
    prefixes = tokenizer.batch_decode([ids[:k] for k in range(len(ids) + 1)], **_DECODE)
    texts = []
    for i, (piece, decoded) in enumerate(zip(pieces, alone)):
        spelled = _spelled_bytes(piece)
        if spelled is not None and spelled.decode("utf-8", errors="replace") == decoded:
            texts.append(_bytes_text(spelled))
        else:
            texts.append(prefixes[i + 1][len(prefixes[i]):])
    return texts
