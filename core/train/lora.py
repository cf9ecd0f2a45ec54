"""LoRA for stage 2 through peft: wrap, freeze, merge. Attention modules never import this.

LoRA adds W x + (alpha / r) B A x to each target linear (recipe: r=8, alpha=16, dropout 0 on
q/k/v/o). Feature maps and mixing factors stay frozen unless asked otherwise. With no target
the model is not wrapped and only what conversion added trains (feature maps, mixing factors,
history parameters): the softmax path keeps the teacher's weights, so a query whose keys all sit
in its window computes exactly the teacher's attention.
"""

from __future__ import annotations

import contextlib

from torch import nn

from core.attention.surgery import decoder_layers, lolcats_modules


class LoraTargetError(ValueError):
    pass


def check_targets(model: nn.Module, targets: list[str]) -> None:
    names = {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    missing = [t for t in targets if t not in names]
    if missing:
        raise LoraTargetError(
            f"LoRA target module(s) {missing} not found in the model; linear layers present: {', '.join(sorted(names))}"
        )


def add_lora(model: nn.Module, rank: int, alpha: float, dropout: float, targets: list[str], train_feature_maps: bool = False):
    """Wrap ``model`` with peft LoRA adapters; only adapters (and optionally feature maps) train.
    With no ``targets``, ``model`` itself comes back with only its conversion parameters trainable."""
    if not targets:
        model.requires_grad_(False)
        _train_conversion_parameters(model)
        return model
    from peft import LoraConfig, get_peft_model

    check_targets(model, targets)
    config = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=dropout, target_modules=list(targets), bias="none")
    peft_model = get_peft_model(model, config)
    if train_feature_maps:
        _train_conversion_parameters(peft_model.get_base_model())
    return peft_model


def _train_conversion_parameters(model: nn.Module) -> None:
    for module in lolcats_modules(model).values():
        for p in module.trained_parameters():
            p.requires_grad_(True)


def merge_lora(model: nn.Module) -> nn.Module:
    """Fold the adapters into the base weights and return the plain (converted) model."""
    if hasattr(model, "merge_and_unload"):
        return model.merge_and_unload()
    return model


def adapters_off(model: nn.Module):
    """A context in which a LoRA-wrapped model computes without its adapters (peft's
    ``disable_adapter``); for a model without adapters, one that changes nothing."""
    return model.disable_adapter() if hasattr(model, "disable_adapter") else contextlib.nullcontext()


def base_model(model: nn.Module) -> nn.Module:
    """The underlying transformers model, with or without a peft wrapper."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


__all__ = ["adapters_off", "add_lora", "merge_lora", "base_model", "check_targets", "LoraTargetError", "decoder_layers"]
