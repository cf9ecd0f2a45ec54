"""Training and evaluation data: sources, file checks, formats, packing, and the loaders.

Each split is a :class:`TokenBlocks` of ``{input_ids, labels, attention_mask}`` tensors, shape
``[num_blocks, seq_len]`` (see :mod:`core.data.loading` for the pipeline).
"""

from core.data.formats import (
    ALPACA_PROMPT_NO_INPUT,
    ALPACA_PROMPT_WITH_INPUT,
    IGNORE_INDEX,
    INSTRUCTION_FIELDS,
    Rows,
    format_alpaca,
    prepare_rows,
    tokenize_instruction,
    tokenize_rows,
    tokenize_text,
)
from core.data.loading import load_blocks, load_data, load_rows, load_spec_data, read_options
from core.data.packing import (DataSplits, TokenBlocks, build_blocks, pack_examples, pad_examples, split_indices,
                               supervised_mask)
from core.data.sources import (
    BUNDLED_ALIASES,
    BUNDLED_DATASETS,
    FILE_BUILDERS,
    BundledDataset,
    bundled_name,
    gsm8k_path,
    held_out_source,
    kjv_sample_path,
    load_raw,
)
from core.data.validation import DataError, check_local_file

__all__ = [
    "ALPACA_PROMPT_NO_INPUT",
    "ALPACA_PROMPT_WITH_INPUT",
    "BUNDLED_ALIASES",
    "BUNDLED_DATASETS",
    "FILE_BUILDERS",
    "IGNORE_INDEX",
    "supervised_mask",
    "INSTRUCTION_FIELDS",
    "BundledDataset",
    "DataError",
    "DataSplits",
    "Rows",
    "TokenBlocks",
    "build_blocks",
    "bundled_name",
    "check_local_file",
    "format_alpaca",
    "gsm8k_path",
    "held_out_source",
    "kjv_sample_path",
    "load_blocks",
    "load_data",
    "load_raw",
    "load_rows",
    "load_spec_data",
    "pack_examples",
    "pad_examples",
    "prepare_rows",
    "read_options",
    "split_indices",
    "tokenize_instruction",
    "tokenize_rows",
    "tokenize_text",
]
