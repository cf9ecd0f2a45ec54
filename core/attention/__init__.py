"""LoLCATs attention in a model: feature maps, the validated functional form, the converted layer and its cache."""

from core.attention.feature_maps import FEATURE_MAPS, HedgehogFeatureMap, T2RFeatureMap, build_feature_map
from core.attention.functional import KINDS, WindowRule, hybrid_attention

__all__ = [
    "FEATURE_MAPS",
    "KINDS",
    "HedgehogFeatureMap",
    "T2RFeatureMap",
    "WindowRule",
    "build_feature_map",
    "hybrid_attention",
]
