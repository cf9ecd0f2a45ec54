"""Model surgery: convert a Hugging Face RoPE decoder's softmax attention to LoLCATs attention.

``linearize(model, LinearizeConfig(...))`` replaces ``self_attn`` of every decoder layer not
listed in ``softmax_layers`` by a :class:`core.attention.layer.LolcatsAttention` that reuses the
pretrained projections. All pretrained weights are frozen; the new feature maps and mixing
factors are the only trainable parameters.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from torch import nn

from core.attention.feature_maps import FEATURE_MAPS, INITS
from core.attention.functional import KINDS
from core.attention.layer import LolcatsAttention, PaddingMask

SUPPORTED_ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3")


class UnsupportedModelError(ValueError):
    """The model is not a RoPE decoder this converter knows."""


@dataclass
class LinearizeConfig:
    attention: str = "terraced"  # linear | sliding_window | terraced (the recipe's "tk" window)
    feature_map: str = "hedgehog"  # hedgehog | t2r
    feature_dim: int = 64  # hedgehog: f (F = 2f); t2r: F
    window_size: int = 64  # sliding window length / terraced tile length
    softmax_layers: list[int] = field(default_factory=list)  # layer indices kept as softmax attention
    init_mix: float = 0.1  # initial window weight sigmoid(mix)
    feature_init: str = "identity"  # identity | random

    def __post_init__(self):
        if self.attention not in KINDS:
            raise ValueError(f"unknown attention kind {self.attention!r}; valid kinds: {', '.join(KINDS)}")
        if self.feature_map not in FEATURE_MAPS:
            raise ValueError(f"unknown feature map {self.feature_map!r}; valid feature maps: {', '.join(FEATURE_MAPS)}")
        if self.feature_init not in INITS:
            raise ValueError(f"unknown feature_init {self.feature_init!r}; valid: {', '.join(INITS)}")
        for name in ("feature_dim", "window_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if not 0.0 < float(self.init_mix) < 1.0:
            raise ValueError(f"init_mix must be in (0, 1), got {self.init_mix!r}")
        layers = [int(i) for i in self.softmax_layers]
        duplicated = sorted({i for i in layers if layers.count(i) > 1})
        if duplicated:
            raise ValueError(f"softmax_layers lists layer(s) {duplicated} more than once: {layers}")
        self.softmax_layers = sorted(layers)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "LinearizeConfig":
        unknown = set(data) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown LinearizeConfig fields: {', '.join(sorted(unknown))}")
        return cls(**data)


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else getattr(model, "model", model)
    layers = getattr(decoder, "layers", None)
    if layers is None:
        raise UnsupportedModelError(f"{type(model).__name__} has no decoder layers (`model.layers`)")
    return layers


def check_supported(model: nn.Module) -> None:
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_ARCHITECTURES:
        raise UnsupportedModelError(
            f"unsupported architecture {model_type!r} ({type(model).__name__}): LoLCATs conversion needs a causal "
            f"decoder with rotary position embeddings (RoPE) and q/k/v/o projections; supported architectures: "
            f"{', '.join(SUPPORTED_ARCHITECTURES)}"
        )


def is_linearized(model: nn.Module) -> bool:
    return getattr(model, "lolcats_config", None) is not None


def linearize(model: nn.Module, config: LinearizeConfig) -> nn.Module:
    """Convert ``model`` in place and return it (see the module docstring)."""
    check_supported(model)
    if is_linearized(model):
        raise ValueError("model is already linearized; load a fresh base model to convert it again")
    layers = decoder_layers(model)
    bad = [i for i in config.softmax_layers if not 0 <= i < len(layers)]
    if bad:
        raise ValueError(f"softmax_layers {bad} out of range: the model has {len(layers)} layers (0..{len(layers) - 1})")
    text_config = model.config.get_text_config(decoder=True)
    num_heads = text_config.num_attention_heads
    num_kv_heads = getattr(text_config, "num_key_value_heads", None) or num_heads
    for p in model.parameters():
        p.requires_grad_(False)
    padding = PaddingMask()
    for i, layer in enumerate(layers):
        if i in config.softmax_layers:
            continue
        layer.self_attn = LolcatsAttention(
            layer.self_attn,
            kind=config.attention,
            feature_map=config.feature_map,
            feature_dim=config.feature_dim,
            window_size=config.window_size,
            init_mix=config.init_mix,
            feature_init=config.feature_init,
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            padding=padding,
        )
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    decoder.register_forward_pre_hook(padding.hook, with_kwargs=True)
    decoder.register_forward_hook(padding.clear, with_kwargs=True)
    model.lolcats_config = config
    return model


def lolcats_modules(model: nn.Module) -> dict[int, LolcatsAttention]:
    """Converted attention modules by layer index."""
    return {i: layer.self_attn for i, layer in enumerate(decoder_layers(model)) if isinstance(layer.self_attn, LolcatsAttention)}


def set_mode(model: nn.Module, mode: str) -> None:
    """Switch every converted layer to ``student``, ``teacher`` or ``distill`` mode."""
    for module in lolcats_modules(model).values():
        module.mode = mode
