"""Checkpoints: safetensors for tensors, JSON for everything else, never pickle.

A checkpoint is a folder::

    tensors.safetensors   trainable tensors (feature maps, mixing factors, LoRA) by parameter name
    optimizer.safetensors optimizer tensors (flattened), when a training state is saved
    state.json            step, stage, scheduler / optimizer scalars, RNG state, metrics, config

Writes are atomic: the folder is written under a temporary name, the old one is moved aside and
the new one renamed into its place, so a crash or a full disk leaves the previous checkpoint valid;
a process killed between the two renames leaves the previous one aside, which
:func:`has_checkpoint` (what a resume asks) puts back.

Checkpoints have one layout whatever the number of processes that trained: parameters and
optimizer states sharded across processes (FSDP's ``DTensor``) are gathered whole when saved
(:func:`trainable_state`, :func:`optimizer_state`: collectives, so every process calls them) and
cut back into this process's shard when loaded (:func:`load_trainable`, :func:`load_optimizer_state`:
local, every process reads the same file). A stage can so resume on another process count.
"""

from __future__ import annotations

import contextlib
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
from torch.distributed.tensor import DTensor, distribute_tensor

TENSORS = "tensors.safetensors"
OPTIMIZER = "optimizer.safetensors"
STATE = "state.json"
PICKLE_SUFFIXES = (".pt", ".pth", ".bin", ".pkl", ".ckpt")


class CheckpointError(ValueError):
    """A checkpoint is missing, unsafe, corrupted or does not match the model."""


def whole(t: torch.Tensor) -> torch.Tensor:
    """The full tensor behind ``t``: a sharded ``DTensor`` is gathered (a collective), others pass."""
    return t.full_tensor() if isinstance(t, DTensor) else t


def local(t: torch.Tensor) -> torch.Tensor:
    """This process's part of ``t``: its shard when ``t`` is a sharded ``DTensor``, else ``t``."""
    return t.to_local() if isinstance(t, DTensor) else t


def shard_like(value: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``value`` (a full tensor) on ``like``'s device and dtype, cut into this process's shard when
    ``like`` is a ``DTensor``. Local: every process must pass the same ``value``."""
    value = value.to(device=like.device, dtype=like.dtype)
    if isinstance(like, DTensor):
        return distribute_tensor(value, like.device_mesh, like.placements, src_data_rank=None)
    return value


def trainable_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """Trainable parameters by name, whole, on the CPU (a collective for sharded models)."""
    return {n: whole(p.detach()).cpu().contiguous() for n, p in model.named_parameters() if p.requires_grad}


def optimizer_state(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """``optimizer.state_dict()`` with sharded states gathered whole (a collective for sharded models)."""
    sd = optimizer.state_dict()
    sd["state"] = {i: {k: whole(v) if isinstance(v, torch.Tensor) else v for k, v in s.items()}
                   for i, s in sd["state"].items()}
    return sd


def load_optimizer_state(optimizer: torch.optim.Optimizer, sd: dict[str, Any]) -> None:
    """Load a state saved by :func:`optimizer_state`, sharding each state like its parameter.

    ``Optimizer.load_state_dict`` only moves states to the parameter's device; per-parameter
    states of a sharded parameter must be sharded too, which this adds."""
    optimizer.load_state_dict(sd)
    for p, s in optimizer.state.items():
        if isinstance(p, DTensor):
            for k, v in s.items():
                if isinstance(v, torch.Tensor) and not isinstance(v, DTensor) and v.shape == p.shape:
                    s[k] = shard_like(v, p)


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
    optimizer: dict[str, Any] | None = None,
    parents: bool = True,
) -> Path:
    """Atomically write a checkpoint folder at ``path`` (replacing any previous one);
    ``optimizer`` is a state dict (:func:`optimizer_state`). ``parents=False`` creates only the
    folder ``path`` sits in, never the ones above it: :class:`FileNotFoundError` when they are gone."""
    path = Path(path)
    path.parent.mkdir(parents=parents, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        save_file(tensors, str(tmp / TENSORS))
        state = dict(state)
        state["torch_rng"] = torch.get_rng_state().tolist()
        if optimizer is not None:
            opt_tensors: dict[str, torch.Tensor] = {}
            state["optimizer"] = _flatten(optimizer, "opt", opt_tensors)
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


def has_checkpoint(path: str | os.PathLike) -> bool:
    """Whether ``path`` holds a checkpoint, once what a process killed inside :func:`save_checkpoint`
    left is undone: the previous version, moved aside (``.<name>.old-*``) with no new one in its
    place, is put back, and half-written ``.<name>.tmp-*`` folders are removed. Call it before any
    write to ``path`` starts (as a resume does): another process's write in flight would be undone."""
    path = Path(path)
    if not path.parent.is_dir():
        return False
    aside = sorted(path.parent.glob(f".{path.name}.old-*"), key=lambda p: p.stat().st_mtime)
    if aside and not path.exists():
        with contextlib.suppress(FileNotFoundError):  # another process of the same run put it back
            os.replace(aside.pop(), path)
    for stale in aside + list(path.parent.glob(f".{path.name}.tmp-*")):
        shutil.rmtree(stale, ignore_errors=True)
    return path.exists()


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
    """Copy ``tensors`` into the model's parameters (into this process's shard of sharded ones),
    checking every name and shape."""
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
            p.copy_(shard_like(value, p))
