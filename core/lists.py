"""The one reader of lists typed as text: ``"256, 1024;4096"`` -> ``[256, 1024, 4096]``.

Items are separated by commas, semicolons or spaces (any mix, repeated separators allowed); an
empty text is an empty list. Torch-free, for the CLI, the job configs and the workbench's forms.
"""

from __future__ import annotations

import re

_SEPARATORS = re.compile(r"[,;\s]+")


def comma_names(text: str) -> list[str]:
    """The non-empty items of ``text``, in order."""
    return [part for part in _SEPARATORS.split(str(text).strip()) if part]


def comma_ints(text: str, what: str = "the list", example: str = "256,1024") -> list[int]:
    """The items of ``text`` as whole numbers; ``ValueError`` naming ``what``, an ``example`` and
    the text otherwise."""
    parts = comma_names(text)
    try:
        return [int(part) for part in parts]
    except ValueError:
        raise ValueError(f"{what} takes whole numbers separated by commas, such as {example}; got {text!r}") from None


__all__ = ["comma_ints", "comma_names"]
