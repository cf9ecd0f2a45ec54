"""Loading converted models back: from a run folder or from an exported standalone folder, and
the base model a run starts from. It sits below the pipeline, beside evaluation, export and the
benchmark, which all load what a run made.

* Run folder (written by :func:`core.pipeline.convert.run_convert`): base model -> convert -> stage-1 best
  tensors -> the layers ``softmax_layers: auto`` chose back to softmax -> LoRA wrap -> stage-2 best tensors.
* Export (:func:`core.export.folder.export`): LoRA merged into the base weights, saved with ``save_pretrained``
  (feature maps and mixing factors included in the safetensors) plus ``lolcats.json`` holding
  the conversion config and the base model. Loading rebuilds the architecture and reads every
  tensor back; the teacher of an export is its base model, loaded when first needed
  (:mod:`core.export.teacher`), not the merged weights with softmax attention.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from safetensors.torch import load_file
from torch import nn

from core.train.checkpoint import CheckpointError, load_trainable, refuse_pickle
from core.config import stored_attention, stored_config
from core.attention.surgery import linearize
from core.export.teacher import TEACHER_ATTRIBUTE, ExportTeacher
from core.attention.surgery import restore_softmax
from core.config import ConvertConfig
from core.models import check_seq_len, load_model, resolve_device, resolve_dtype
from core.run_folder import CHOICE_FILE, CONFIG_FILE, EXPORT_CONFIG, STAGE1, STAGE2, is_export, is_run
from core.train.finetune_lora import wrap_for_stage2
from core.train.loop import load_best


def load_teacher(config: ConvertConfig, workspace=None, device: str | None = None) -> tuple[nn.Module, object]:
    """The run's base model and tokenizer, unconverted (on ``device``, default ``model.device``),
    refused when ``data.seq_len`` exceeds its context."""
    m = config.model
    model, tokenizer = load_model(m.source, dtype=m.dtype, device=device or m.device, workspace=workspace,
                                  trust_remote_code=m.trust_remote_code)
    check_seq_len(model, config.data.seq_len)
    return model, tokenizer


def saved_choice(output: str | os.PathLike) -> dict | None:
    """The softmax-layer choice a run folder keeps (core.pipeline.softmax_choice), or None when it has none."""
    path = Path(output) / CHOICE_FILE
    if not path.is_file():
        return None
    choice = json.loads(path.read_text())
    if "score" in choice:  # written before the score method was named as the config names it
        choice["softmax_score"] = choice.pop("score")
    return choice


def apply_saved_choice(model: nn.Module, config: ConvertConfig, output: str | os.PathLike) -> None:
    """Restore the layers a finished choice kept softmax, for a run loaded back from its folder."""
    if config.attention.softmax_layers != "auto":
        return
    choice = saved_choice(output)
    if choice is None:
        raise ValueError(f"{output} has softmax_layers 'auto' but no {CHOICE_FILE}: the run stopped before "
                         "choosing its softmax layers; resume it")
    restore_softmax(model, choice["softmax_layers"])


def load_converted(path: str | os.PathLike, device: str = "auto", workspace=None,
                   dtype: str | None = None) -> tuple[nn.Module, object, dict]:
    """Rebuild the converted model in one call; returns ``(model, tokenizer, info)``.

    ``dtype`` (``float32``, ``bfloat16``, ``float16``): cast the rebuilt model's weights to it, e.g.
    ``bfloat16`` for chat and benchmarks (half the weights' memory); default: the dtype the run
    trained in (an export: its weights')."""
    path = Path(path)
    refuse_pickle(path)
    if not path.exists():
        raise CheckpointError(f"{path} does not exist; point to a run folder or an exported folder")
    model, tokenizer, info = _load_export(path, device, workspace) if is_export(path) \
        else _load_run(path, device, workspace)
    if dtype is not None:
        model.to(resolve_dtype(dtype))
    return model, tokenizer, info


def _load_run(path: Path, device: str, workspace) -> tuple[nn.Module, object, dict]:
    if not is_run(path):
        raise CheckpointError(f"{path} is not a converted run folder (config.json and stage checkpoints expected)")
    config = stored_config(json.loads((path / CONFIG_FILE).read_text()))
    model, tokenizer = load_teacher(config, workspace, device)
    linearize(model, config.attention)
    if (path / STAGE1 / "best").exists():
        load_best(model, path, STAGE1)
    apply_saved_choice(model, config, path)
    if (path / STAGE2 / "best").exists():
        model = wrap_for_stage2(model, config.stage2)
        load_best(model, path, STAGE2)
    model.eval()
    return model, tokenizer, {"kind": "run", "config": config.model_dump()}


def _export_base_model(meta: dict) -> dict | None:
    """The base model an export names; for an export from before it was recorded, the one in its
    source run's config.json when that run folder still exists."""
    if meta.get("base_model"):
        return meta["base_model"]
    run_config = Path(meta.get("source_run", "")) / CONFIG_FILE
    if meta.get("source_run") and run_config.is_file():
        return json.loads(run_config.read_text())["model"]
    return None


def _load_base_architecture(path: Path) -> tuple[nn.Module, object]:
    """The export's weights in transformers' own class of its base architecture (never the exported
    modeling code, which ``trust_remote_code=False`` leaves alone); the LoLCATs tensors are then
    loaded by :func:`_load_export` after conversion."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the LoLCATs tensors are unexpected here by design: checked below
    try:
        model, loading = AutoModelForCausalLM.from_pretrained(path, trust_remote_code=False, dtype="auto",
                                                              output_loading_info=True)
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError, RuntimeError) as exc:
        raise CheckpointError(f"{path} is not a complete exported model ({type(exc).__name__}: {exc}); "
                              "export the run again with `lolcats export`") from exc
    finally:
        hf_logging.set_verbosity(verbosity)
    unexpected = sorted(k for k in loading["unexpected_keys"] if not is_lolcats_tensor(k))
    if loading["missing_keys"] or unexpected:
        raise CheckpointError(f"{path} does not hold the weights its config.json describes (missing: "
                              f"{sorted(loading['missing_keys'])[:5]}, unexpected: {unexpected[:5]}); "
                              "export the run again with `lolcats export`")
    return model, tokenizer


def is_lolcats_tensor(name: str) -> bool:
    """Feature-map weights, mixing factors, history exponents, decay rates and history gates: the
    tensors conversion adds to a layer."""
    return (".feature_map_" in name or ".history_gate." in name
            or name.endswith((".mix", ".history_power", ".history_decay")))


def _load_export(path: Path, device: str, workspace) -> tuple[nn.Module, object, dict]:
    meta = json.loads((path / EXPORT_CONFIG).read_text())
    model, tokenizer = _load_base_architecture(path)
    saved = dict(meta["attention"] if "attention" in meta else meta["linearize"])  # "linearize" before
    if "attention" in saved:  # exported before the spec took the YAML's names: attention -> kind
        saved["kind"] = saved.pop("attention")
    linearize(model, stored_attention(saved))
    extras = {}
    for file in sorted(path.glob("*.safetensors")):
        extras.update({k: v for k, v in load_file(str(file)).items() if is_lolcats_tensor(k)})
    if not extras:
        raise CheckpointError(f"{path} has no feature-map tensors; was it exported by `lolcats export`?")
    load_trainable(model, extras, f"exported model {path}")
    model.to(resolve_device(device)).eval()
    setattr(model, TEACHER_ATTRIBUTE, ExportTeacher(_export_base_model(meta), workspace))
    return model, tokenizer, {"kind": "export", **meta}
