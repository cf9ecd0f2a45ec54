"""Writing an export: a standalone folder (LoRA merged) that plain transformers loads and
:func:`core.load.load_converted` reads back, and uploading it to the Hugging Face Hub.

The folder holds the merged weights (``save_pretrained``: the feature maps and mixing factors
included), the tokenizer, the generated modeling code with ``config.json`` pointing at it
(:mod:`core.export.modeling`), ``lolcats.json`` (:data:`core.run_folder.EXPORT_CONFIG`: the
attention spec, the run's config, its base model) and the model card (:mod:`core.export.card`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from core.config import stored_config
from core.export.card import CARD_FILE, model_card
from core.export.modeling import MODEL_CLASS, MODELING_FILE, auto_map, modeling_source
from core.export.teacher import base_model_metadata
from core.load import load_converted
from core.run_folder import CONFIG_FILE, EXPORT_CONFIG
from core.train.lora import merge_lora


def export(run_dir: str | os.PathLike, out_dir: str | os.PathLike, workspace=None, name: str | None = None) -> Path:
    """Write a standalone folder with LoRA merged; :func:`load_converted` reads it back.

    ``lolcats.json`` holds the attention spec, the run's config and its base model
    (:func:`core.export.teacher.base_model_metadata`), which teacher comparisons load; the
    folder also carries its modeling code (:func:`write_modeling_code`) and its model card
    (:func:`core.export.card.model_card`), which calls the export ``name``: the folder's name unless
    given (a folder written under a temporary name and renamed after passes its final name)."""
    model, tokenizer, info = load_converted(run_dir, device="cpu", workspace=workspace)
    config = stored_config(info["config"])
    model = merge_lora(model)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    write_modeling_code(out, type(model).__name__, model.attention_spec.model_dump())
    meta = {"attention": model.attention_spec.model_dump(),
            "base_model": base_model_metadata(config.model.model_dump(), model),
            "config": config.model_dump(), "source_run": str(Path(run_dir).resolve())}
    (out / EXPORT_CONFIG).write_text(json.dumps(meta, indent=2))
    (out / CARD_FILE).write_text(model_card(Path(run_dir), meta["base_model"], meta["attention"], name or out.name))
    return out


def push_to_hub(folder: str | os.PathLike, repo_id: str, private: bool = False) -> str:
    """Upload an exported folder to the Hugging Face Hub repository ``repo_id`` (created if needed,
    with the token of ``huggingface-cli login`` or ``HF_TOKEN``); returns the commit URL."""
    from huggingface_hub import HfApi

    api = HfApi()
    api.create_repo(repo_id, private=private, exist_ok=True)
    return str(api.upload_folder(repo_id=repo_id, folder_path=str(folder), commit_message="LoLCATs export"))


def write_modeling_code(out: Path, base_class: str, spec: dict) -> None:
    """Make ``out`` loadable by plain transformers: the generated ``modeling_lolcats.py``
    (:mod:`core.export.modeling`) and, in ``config.json``, ``auto_map`` pointing at it, the
    ``architectures`` it defines and ``lolcats``, the attention spec it converts with."""
    (out / MODELING_FILE).write_text(modeling_source(base_class))
    config_file = out / CONFIG_FILE
    config = json.loads(config_file.read_text())
    config.update({"architectures": [MODEL_CLASS], "auto_map": auto_map(), "lolcats": spec})
    config_file.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


__all__ = ["export", "push_to_hub", "write_modeling_code"]
