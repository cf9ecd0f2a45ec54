"""Training and evaluation data: sources, file checks, formats, packing, and the loaders.

Each split is a :class:`TokenBlocks` of ``{input_ids, labels, attention_mask}`` tensors, shape
``[num_blocks, seq_len]`` (see :mod:`core.data.loading` for the pipeline). Names are imported on
first use (PEP 562): checking a data source before a job is queued (:mod:`core.data.preflight`)
imports neither torch nor ``datasets``.
"""

from __future__ import annotations

from core.lazy import lazy_exports

_EXPORTS = {
    ".formats": ["ALPACA_PROMPT_NO_INPUT", "ALPACA_PROMPT_WITH_INPUT", "IGNORE_INDEX", "INSTRUCTION_FIELDS", "Rows",
                 "format_alpaca", "prepare_rows", "tokenize_instruction", "tokenize_rows", "tokenize_text"],
    ".loading": ["load_blocks", "load_data", "load_rows", "load_spec_data", "read_options"],
    ".packing": ["DataSplits", "TokenBlocks", "build_blocks", "pack_examples", "pad_examples", "split_indices",
                 "supervised_mask"],
    ".sources": ["BUNDLED_ALIASES", "BUNDLED_DATASETS", "FILE_BUILDERS", "BundledDataset", "bundled_name",
                 "gsm8k_path", "held_out_source", "kjv_sample_path", "load_raw"],
    ".validation": ["DataError", "check_local_file"],
    ".preflight": ["DataSourceError", "check_data_spec"],
}

__getattr__, __dir__, __all__ = lazy_exports(__name__, _EXPORTS)
