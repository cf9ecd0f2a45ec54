"""The conversion config: schema, shared constants, presets and loading; imports neither torch nor transformers.

    from core.config import load_config, preset
    config = load_config("run.yaml", overrides=["attention.window_size=32"])
    config = preset("tiny-test", data={"seq_len": 32})
"""

from core.config.constants import (
    BUNDLED_MODEL,
    DTYPES,
    FEATURE_INITS,
    FEATURE_MAPS,
    KINDS,
    SUPPORTED_ARCHITECTURES,
    TINY_MODEL,
)
from core.config.loading import (EVALUATION_FIELDS, apply_overrides, config_fields, evaluation_overrides, load_config,
                                 parse_yaml_mapping, preset, read_yaml_mapping)
from core.config.presets import PRESET_DESCRIPTIONS, PRESETS
from core.config.schema import (
    AttentionSpec,
    ConfigError,
    ConvertConfig,
    DataSpec,
    EvalSpec,
    FORMER_NAMES,
    LongContextSpec,
    ModelSpec,
    PREDATING,
    Stage1Spec,
    Stage2Spec,
    build_config,
    build_spec,
    current_names,
    field_choices,
    format_validation_error,
    stored_attention,
    stored_config,
    validation_problems,
)
from core.config.tree import FieldChange, config_diff, deep_merge, get_dotted, set_dotted

__all__ = [
    "BUNDLED_MODEL",
    "DTYPES",
    "FEATURE_INITS",
    "FEATURE_MAPS",
    "FORMER_NAMES",
    "KINDS",
    "PREDATING",
    "PRESETS",
    "PRESET_DESCRIPTIONS",
    "SUPPORTED_ARCHITECTURES",
    "TINY_MODEL",
    "AttentionSpec",
    "ConfigError",
    "ConvertConfig",
    "DataSpec",
    "EvalSpec",
    "LongContextSpec",
    "FieldChange",
    "ModelSpec",
    "Stage1Spec",
    "Stage2Spec",
    "EVALUATION_FIELDS",
    "evaluation_overrides",
    "apply_overrides",
    "build_config",
    "build_spec",
    "config_diff",
    "current_names",
    "deep_merge",
    "field_choices",
    "format_validation_error",
    "load_config",
    "preset",
    "read_yaml_mapping",
    "parse_yaml_mapping",
    "config_fields",
    "get_dotted",
    "set_dotted",
    "stored_attention",
    "stored_config",
    "validation_problems",
]
