"""Model surgery: convert a Hugging Face RoPE decoder's softmax attention to LoLCATs attention.

``linearize(model, AttentionSpec(...))`` replaces ``self_attn`` of every decoder layer not
listed in ``softmax_layers`` (nor, with ``keep_sliding_layers``, one of the model's own
sliding-window layers, such as Gemma 3's local ones) by a
:class:`core.attention.layer.LolcatsAttention` that reuses the pretrained projections. All
pretrained weights are frozen; the new feature maps and mixing factors are the only trainable
parameters. ``softmax_layers="auto"`` converts every layer here; the pipeline later gives the
chosen ones their softmax attention back with :func:`restore_softmax`.
"""

from __future__ import annotations

from torch import nn

from core.attention.layer import LolcatsAttention, PaddingMask
from core.attention.rotary import layer_rotary
from core.config import PREDATING, SUPPORTED_ARCHITECTURES, AttentionSpec, ConfigError


class UnsupportedModelError(ValueError):
    """The model is not a RoPE decoder this converter knows."""


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
    return getattr(model, "attention_spec", None) is not None


def sliding_layers(text_config, num_layers: int) -> set[int]:
    """Indices of the layers whose own attention is a sliding window: those ``layer_types`` marks
    ``sliding_attention`` (Gemma 3, Qwen2), else every layer when the config sets a
    ``sliding_window`` without layer types (Mistral)."""
    layer_types = getattr(text_config, "layer_types", None)
    if layer_types:
        return {i for i, kind in enumerate(layer_types[:num_layers]) if kind == "sliding_attention"}
    return set(range(num_layers)) if getattr(text_config, "sliding_window", None) else set()


def _listed_softmax_layers(spec) -> list[int]:
    """The layers ``spec`` names as softmax; none yet when it says ``"auto"`` (chosen after stage 1)."""
    return [] if spec.softmax_layers == "auto" else list(spec.softmax_layers)


def linearize(model: nn.Module, spec: AttentionSpec) -> nn.Module:
    """Convert ``model`` in place and return it (see the module docstring); ``model.attention_spec`` keeps ``spec``."""
    check_supported(model)
    if is_linearized(model):
        raise ConfigError("model is already linearized; load a fresh base model to convert it again")
    layers = decoder_layers(model)
    listed = _listed_softmax_layers(spec)
    bad = [i for i in listed if not 0 <= i < len(layers)]
    if bad:
        raise ConfigError(f"softmax_layers {bad} out of range: the model has {len(layers)} layers (0..{len(layers) - 1})")
    text_config = model.config.get_text_config(decoder=True)
    num_heads = text_config.num_attention_heads
    num_kv_heads = getattr(text_config, "num_key_value_heads", None) or num_heads
    for p in model.parameters():
        p.requires_grad_(False)
    keep = set(listed)
    if getattr(spec, "keep_sliding_layers", False):  # exports written before the field lack it (and the layer takes none)
        keep |= sliding_layers(text_config, len(layers))
        if len(keep) == len(layers):
            raise ConfigError(
                f"keep_sliding_layers keeps every layer of this model softmax ({len(layers)} sliding-window "
                "layers, no global one): nothing would be converted; leave it off"
            )
    padding = PaddingMask()
    originals = {}
    for i, layer in enumerate(layers):
        if i in keep:
            continue
        originals[i] = layer.self_attn
        layer.self_attn = LolcatsAttention(
            layer.self_attn,
            kind=spec.kind,
            feature_map=spec.feature_map,
            feature_dim=spec.feature_dim,
            window_size=spec.window_size,
            sink_tokens=spec.sink_tokens,
            **{name: getattr(spec, name, before) for name, before in PREDATING["attention"].items()},
            init_mix=spec.init_mix,
            feature_init=spec.feature_init,
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            padding=padding,
        )
        layer.self_attn.rotary = layer_rotary(model, i)
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    decoder.register_forward_pre_hook(padding.hook, with_kwargs=True)
    decoder.register_forward_hook(padding.clear, with_kwargs=True)
    model.lolcats_originals = originals  # a plain dict, not submodules: the state dict is unchanged
    model.attention_spec = spec
    return model


def restore_softmax(model: nn.Module, layers: list[int]) -> None:
    """Give converted ``layers`` back the softmax attention module they replaced (same weights,
    their feature maps dropped) and record them in ``model.attention_spec.softmax_layers``, which
    then lists the layers kept softmax explicitly (``"auto"`` resolved)."""
    converted = lolcats_modules(model)
    missing = sorted(set(layers) - set(converted))
    if missing:
        raise ConfigError(f"layers {missing} are not converted layers of this model; converted: {sorted(converted)}")
    decoder = decoder_layers(model)
    for i in layers:
        decoder[i].self_attn = model.lolcats_originals.pop(i)
    spec = model.attention_spec
    listed = _listed_softmax_layers(spec)
    model.attention_spec = spec.model_copy(update={"softmax_layers": sorted({*listed, *layers}), "softmax_budget": None})


def lolcats_modules(model: nn.Module) -> dict[int, LolcatsAttention]:
    """Converted attention modules by layer index."""
    return {i: layer.self_attn for i, layer in enumerate(decoder_layers(model)) if isinstance(layer.self_attn, LolcatsAttention)}


def softmax_layer_indices(model: nn.Module) -> list[int]:
    """Indices of the decoder layers that compute softmax attention (not converted, or restored)."""
    converted = lolcats_modules(model)
    return [i for i in range(len(decoder_layers(model))) if i not in converted]
