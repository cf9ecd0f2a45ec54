"""Checkpoints: safetensors for tensors, JSON for everything else, never pickle.

A checkpoint is a folder::

    tensors.safetensors   trainable tensors (feature maps, mixing factors, LoRA) by parameter name
    optimizer.safetensors optimizer tensors (flattened), when a training state is saved
    state.json            step, stage, scheduler / optimizer scalars, RNG state, metrics, config

Writes are atomic: the folder is written under a temporary name and renamed over the old one,
so a crash or a full disk leaves the previous checkpoint valid.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

TENSORS = "tensors.safetensors"
OPTIMIZER = "optimizer.safetensors"
STATE = "state.json"
PICKLE_SUFFIXES = (".pt", ".pth", ".bin", ".pkl", ".ckpt")


class CheckpointError(ValueError):
    """A checkpoint is missing, unsafe, corrupted or does not match the model."""


def trainable_state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().cpu().contiguous() for n, p in model.named_parameters() if p.requires_grad}


def _flatten(obj: Any, prefix: str, tensors: dict[str, torch.Tensor]) -> Any:
    """Replace tensors inside nested dicts/lists by {"__tensor__": key}, collecting them."""
    if isinstance(obj, torch.Tensor):
        key = f"{prefix}"
        tensors[key] = obj.detach().cpu().contiguous()
        return {"__tensor__": key}
    if isinstance(obj, dict):
        return {"__dict__": [[_flatten(k, f"{prefix}.k{i}", tensors), _flatten(v, f"{prefix}.{i}", tensors)]
                             for i, (k, v) in enumerate(obj.items())]}
    if isinstance(obj, (list, tuple)):
        return {"__list__": [_flatten(v, f"{prefix}.{i}", tensors) for i, v in enumerate(obj)]}
    if isinstance(obj, float) and not (obj == obj and abs(obj) != float("inf")):
        return {"__float__": repr(obj)}
    return obj


def _unflatten(obj: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(obj, dict):
        if "__tensor__" in obj:
            return tensors[obj["__tensor__"]]
        if "__dict__" in obj:
            return {_unflatten(k, tensors): _unflatten(v, tensors) for k, v in obj["__dict__"]}
        if "__list__" in obj:
            return [_unflatten(v, tensors) for v in obj["__list__"]]
        if "__float__" in obj:
            return float(obj["__float__"])
    return obj


def save_checkpoint(
    path: str | os.PathLike,
    tensors: dict[str, torch.Tensor],
    state: dict[str, Any],
    optimizer: torch.optim.Optimizer | None = None,
) -> Path:
    """Atomically write a checkpoint folder at ``path`` (replacing any previous one)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        save_file(tensors, str(tmp / TENSORS))
        state = dict(state)
        state["torch_rng"] = torch.get_rng_state().tolist()
        if optimizer is not None:
            opt_tensors: dict[str, torch.Tensor] = {}
            state["optimizer"] = _flatten(optimizer.state_dict(), "opt", opt_tensors)
            save_file(opt_tensors, str(tmp / OPTIMIZER))
        with open(tmp / STATE, "w") as f:
            json.dump(state, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        old = None
        if path.exists():
            old = path.parent / f".{path.name}.old-{uuid.uuid4().hex[:8]}"
            os.replace(path, old)
        os.replace(tmp, path)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def refuse_pickle(path: Path) -> None:
    if path.is_file() and path.suffix in PICKLE_SUFFIXES:
        raise CheckpointError(
            f"{path} is a pickle file; pickles can run arbitrary code and are never loaded. "
            "Point to a converted run folder (it holds safetensors)."
        )


def load_checkpoint(path: str | os.PathLike) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Tensors and state (with ``state["optimizer"]`` restored to a state dict when present)."""
    path = Path(path)
    refuse_pickle(path)
    if not (path / TENSORS).is_file() or not (path / STATE).is_file():
        raise CheckpointError(f"{path} is not a checkpoint folder (expected {TENSORS} and {STATE})")
    try:
        tensors = load_file(str(path / TENSORS))
        state = json.loads((path / STATE).read_text())
        if "optimizer" in state:
            opt_tensors = load_file(str(path / OPTIMIZER))
            state["optimizer"] = _unflatten(state["optimizer"], opt_tensors)
    except (SafetensorError, json.JSONDecodeError, OSError, KeyError) as e:
        raise CheckpointError(f"checkpoint {path} is corrupted ({e}); resume from an earlier checkpoint") from e
    return tensors, state


def restore_rng(state: dict[str, Any]) -> None:
    if "torch_rng" in state:
        torch.set_rng_state(torch.tensor(state["torch_rng"], dtype=torch.uint8))


def load_trainable(model: nn.Module, tensors: dict[str, torch.Tensor], what: str = "checkpoint") -> None:
    """Copy ``tensors`` into the model's parameters, checking every name and shape."""
    params = dict(model.named_parameters())
    missing = [n for n in tensors if n not in params]
    if missing:
        raise CheckpointError(
            f"{what} does not match this model: {len(missing)} tensor(s) have no parameter here, e.g. "
            f"{missing[:3]}; was it made from a different base model or attention config?"
        )
    for name, value in tensors.items():
        p = params[name]
        if p.shape != value.shape:
            raise CheckpointError(
                f"{what} does not match this model: {name} has shape {tuple(value.shape)} in the checkpoint "
                f"and {tuple(p.shape)} in the model (different base model, feature_dim or heads?)"
            )
        with torch.no_grad():
            p.copy_(value.to(p.dtype))
