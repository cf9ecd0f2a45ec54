"""Row formats and tokenisation: the Alpaca template, label masking, field renaming.

* **instruction** rows with ``instruction``, optional ``input`` and ``output`` fields, rendered
  with the Alpaca prompt template. The prompt tokens get label ``-100`` (no loss); the response
  tokens and the closing EOS keep their ids as labels.
* **text** rows with one text field (default ``text``); every token is a label.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Sequence

import numpy as np

from core.data.sources import BUNDLED_DATASETS, bundled_name
from core.data.validation import DataError

IGNORE_INDEX = -100  # label value the cross-entropy loss skips (prompt tokens, padding)

# The Stanford Alpaca prompt templates (with and without the optional input field).
ALPACA_PROMPT_WITH_INPUT = (
    "Below is an instruction that describes a task, paired with an input that provides further context. "
    "Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n"
)
ALPACA_PROMPT_NO_INPUT = (
    "Below is an instruction that describes a task. "
    "Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Response:\n"
)

INSTRUCTION_FIELDS = ("instruction", "input", "output")  # "input" is optional

@dataclass
class Rows:
    """Source rows after renaming and filtering, as plain string columns."""

    format: Literal["instruction", "text"]
    columns: dict[str, list[str]]  # instruction: instruction/input/output; text: text
    dropped: int = 0  # rows removed because a required field was empty

    def __len__(self) -> int:
        return len(next(iter(self.columns.values())))

    def select(self, indices) -> "Rows":
        return Rows(self.format, {k: [v[i] for i in indices] for k, v in self.columns.items()}, self.dropped)


def format_alpaca(instruction: str, input: str = "") -> str:
    """The Alpaca prompt for one example, ending with ``"### Response:\\n"`` (the response follows)."""
    if input and input.strip():
        return ALPACA_PROMPT_WITH_INPUT.format(instruction=instruction, input=input)
    return ALPACA_PROMPT_NO_INPUT.format(instruction=instruction)


def eos_id(tokenizer) -> int:
    if tokenizer.eos_token_id is None:
        raise DataError("the tokenizer has no EOS token, needed to separate packed examples; set tokenizer.eos_token")
    return int(tokenizer.eos_token_id)


def leading_bos_id(tokenizer) -> int | None:
    """The BOS id when the tokenizer itself starts every text with it (Gemma, Llama 3), else None.

    Such models are trained on sequences that begin with BOS and score a block that does not far
    worse (Gemma 3 270M: held-out perplexity 12.6 without, 2.8 with), so packed blocks of them
    start with BOS too (:func:`core.data.packing.pack_examples`)."""
    bos = tokenizer.bos_token_id
    if bos is None:
        return None
    ids = tokenizer("a")["input_ids"]
    return int(bos) if ids and ids[0] == bos else None


def tokenize_instruction(
    tokenizer, instructions: list[str], inputs: list[str], outputs: list[str]
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Tokenise Alpaca examples; return ``(ids, labels)`` per example with the prompt masked.

    ``ids = prompt + response + [EOS]``. Prompt and response are tokenised separately, so the
    mask boundary is exact; the prompt gets the tokenizer's special tokens (a BOS, if it adds one).
    """
    eos = eos_id(tokenizer)
    prompts = [format_alpaca(i, x) for i, x in zip(instructions, inputs)]
    prompt_ids = tokenizer(prompts, add_special_tokens=True)["input_ids"]
    response_ids = tokenizer(outputs, add_special_tokens=False)["input_ids"]
    examples = []
    for p, r in zip(prompt_ids, response_ids):
        ids = np.asarray([*p, *r, eos], dtype=np.int64)
        labels = ids.copy()
        labels[: len(p)] = IGNORE_INDEX
        examples.append((ids, labels))
    return examples


def tokenize_text(tokenizer, texts: list[str]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Tokenise plain text; ``ids = text + [EOS]`` and every token is a label."""
    eos = eos_id(tokenizer)
    examples = []
    for t in tokenizer(texts, add_special_tokens=False)["input_ids"]:
        ids = np.asarray([*t, eos], dtype=np.int64)
        examples.append((ids, ids.copy()))
    return examples


def tokenize_rows(rows: Rows, tokenizer, batch_size: int = 1000) -> list[tuple[np.ndarray, np.ndarray]]:
    out: list[tuple[np.ndarray, np.ndarray]] = []
    cols = rows.columns
    for start in range(0, len(rows), batch_size):
        sl = slice(start, start + batch_size)
        if rows.format == "instruction":
            out += tokenize_instruction(tokenizer, cols["instruction"][sl], cols["input"][sl], cols["output"][sl])
        else:
            out += tokenize_text(tokenizer, cols["text"][sl])
    return out


def _as_text(value) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else str(value)


def _name(source: Any) -> str:
    return source if isinstance(source, str) else "the dataset"


def field_plan(present: Sequence[str], source: Any, format: Literal["auto", "instruction", "text"] = "auto",
               columns: dict[str, str] | None = None, text_field: str = "text") -> tuple[str, dict[str, str]]:
    """``(format, renames)`` for data whose rows have the fields ``present``: the format decided
    (``"auto"``: from the fields, or a bundled set's own) and the field renames (source field ->
    role: a bundled set's mapping, then ``columns``). Raises :class:`DataError` naming the fields
    present when a renamed field is missing or the format's fields are absent (instruction:
    ``instruction`` and ``output``, optional ``input``; text: ``text_field``)."""
    name = _name(source)
    bundled = BUNDLED_DATASETS.get(bundled_name(source) or "")
    renames = dict(bundled.columns if bundled else {})
    renames.update(columns or {})
    fmt = format if format != "auto" else (bundled.format if bundled else "auto")
    missing = [src for src in renames if src not in present]
    if missing:
        raise DataError(
            f"dataset {name!r}: the columns mapping names field(s) {', '.join(map(repr, missing))} that "
            f"the data lacks; fields present: {', '.join(present)}"
        )
    fields = list(renames.values()) + [c for c in present if c not in renames and c not in renames.values()]
    mapping_hint = "map your fields with columns={'question': 'instruction', 'answer': 'output'}"
    if fmt == "auto":
        if "instruction" in fields and "output" in fields:
            fmt = "instruction"
        elif text_field in fields:
            fmt = "text"
        else:
            raise DataError(
                f"dataset {name!r}: cannot tell the format. Instruction data needs fields 'instruction' and "
                f"'output' (optional 'input'); text data needs the text field {text_field!r}. Fields "
                f"present: {', '.join(fields)}. Set format, text_field, or {mapping_hint}"
            )
    if fmt == "instruction":
        need = [f for f in ("instruction", "output") if f not in fields]
        if need:
            raise DataError(
                f"dataset {name!r}: instruction data needs field(s) {', '.join(map(repr, need))}; fields "
                f"present: {', '.join(fields)}; {mapping_hint}"
            )
    elif fmt == "text":
        if text_field not in fields:
            raise DataError(
                f"dataset {name!r}: text data needs the text field {text_field!r}; fields present: "
                f"{', '.join(fields)}; set text_field to the field holding the text"
            )
    else:
        raise DataError(f"format must be 'auto', 'instruction' or 'text', got {format!r}")
    return fmt, renames


def prepare_rows(raw, source: Any, format: Literal["auto", "instruction", "text"] = "auto",
                 columns: dict[str, str] | None = None, text_field: str = "text") -> Rows:
    """Rename fields, decide the format, check the needed fields exist (:func:`field_plan`), and
    drop empty rows.

    ``raw`` is what :func:`core.data.sources.load_raw` read from ``source`` (which names it in
    messages and picks a bundled set's field mapping); ``columns`` renames more fields (source
    field -> role, e.g. ``{"question": "instruction"}``); ``format="auto"`` decides from the fields.
    """
    name = _name(source)
    if len(raw) == 0:
        raise DataError(f"dataset {name!r} is empty (0 rows); add rows or choose another dataset")
    fmt, renames = field_plan(list(raw.column_names), source, format, columns, text_field)
    roles = {role: src for src, role in renames.items()}

    def column(role: str) -> list[str]:
        return [_as_text(v) for v in raw[roles.get(role, role)]]

    if fmt == "instruction":
        cols = {"instruction": column("instruction"), "output": column("output")}
        has_input = "input" in roles or ("input" in raw.column_names and "input" not in renames)
        cols["input"] = column("input") if has_input else [""] * len(cols["output"])
        keep = [i for i, (a, b) in enumerate(zip(cols["instruction"], cols["output"])) if a.strip() and b.strip()]
        why_empty = "an empty 'instruction' or 'output'"
    else:
        cols = {"text": [t.rstrip() for t in column(text_field)]}  # EOS follows; drop trailing newlines
        keep = [i for i, t in enumerate(cols["text"]) if t.strip()]
        why_empty = f"an empty {text_field!r} field"

    total = len(raw)
    if not keep:
        raise DataError(f"dataset {name!r}: all {total} rows have {why_empty}, so nothing is left; fix the data")
    rows = Rows(fmt, cols)
    if len(keep) < total:
        rows = rows.select(keep)
    rows.dropped = total - len(keep)
    return rows
