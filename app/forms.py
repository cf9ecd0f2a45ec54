"""Launch form <-> ConvertConfig, without Streamlit (so it is testable on its own).

The form edits a subset of the config (the fields a person changes most); every other field keeps
the value of the chosen preset. :func:`validate` builds the :class:`core.config.ConvertConfig` and
returns every problem as ``(field, message)``, so the page can show each one next to the form.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from core.config import (
    BUNDLED_MODEL,
    PRESETS,
    TINY_MODEL,
    ConfigError,
    ConvertConfig,
    config_fields,
    deep_merge,
    get_dotted,
    parse_yaml_mapping,
    set_dotted,
    validation_problems,
)
from core.data.preflight import DataSourceError
from core.lists import comma_ints
from core.models import ModelFitError
from core.pipeline.preflight import check_conversion

RECIPE = "paper recipe (defaults)"
MODEL_CHOICES = {
    "bundled": "Bundled SmolLM2-135M-Instruct (no download)",
    "tiny": "Tiny random Llama (seconds; for smoke tests)",
    "hub": "Hugging Face hub id",
    "local": "Local folder or .gguf file",
}
AUTO = "auto"  # softmax_layers: let the conversion choose the layers kept softmax after stage 1
DEFAULT_BUDGET = 2  # layers kept softmax with AUTO when the config sets no budget
SCORE_HELP = {  # what each attention.softmax_score ranks the converted layers by
    "kl": "next-token KL to the teacher with only that layer linear",
    "mse": "attention-output MSE normalised by the teacher output's variance",
}
DATA_CHOICES = {
    "gsm8k": "GSM8K test pairs (bundled, instructions)",
    "kjv-sample": "King James Version sample (bundled, plain text)",
    "hub": "Hugging Face dataset id",
    "local": "Local json / jsonl / parquet / txt file",
}


def preset_names() -> list[str]:
    return [RECIPE, *PRESETS]


def preset_config(name: str) -> dict[str, Any]:
    """The full config dict of a preset (recipe defaults filled in)."""
    overrides = {} if name == RECIPE else PRESETS[name]
    return ConvertConfig.model_validate(overrides).model_dump()


def closest_preset(config: dict[str, Any]) -> str:
    """The preset whose form shows the most of ``config``'s values (the first such, in
    :func:`preset_names` order): what the preset box names when the form holds a loaded config."""
    shown = form_values(config)
    return max(preset_names(), key=lambda name: sum(
        value == shown.get(field) for field, value in form_values(preset_config(name)).items()))


def _model_choice(source: str) -> tuple[str, str]:
    if source.lower() == BUNDLED_MODEL:
        return "bundled", ""
    if source.lower() == TINY_MODEL:
        return "tiny", ""
    looks_local = source.startswith((".", "/", "~")) or source.endswith(".gguf") or source.count("/") != 1
    return ("local" if looks_local else "hub"), source


def _data_choice(source: str) -> tuple[str, str]:
    if source in ("gsm8k", "gsm8k-test"):
        return "gsm8k", ""
    if source in ("kjv", "kjv-sample"):
        return "kjv-sample", ""
    looks_local = source.startswith((".", "/", "~")) or "." in source.rsplit("/", 1)[-1]
    return ("local" if looks_local else "hub"), source


# The config fields the form edits, by dotted path: each one's widget is keyed by its path (the page
# adds a prefix), so form_values and build map them both ways. model.source and data.source are
# edited by the source pickers (model_choice / model_path, data_choice / data_path).
FIELDS = (
    "model.dtype", "model.device",
    "data.format", "data.seq_len", "data.max_examples", "data.val_examples",
    "attention.kind", "attention.feature_map", "attention.feature_dim", "attention.window_size",
    "attention.sink_tokens", "attention.softmax_layers", "attention.softmax_budget", "attention.softmax_score",
    *(f"{stage}.{name}" for stage in ("stage1", "stage2") for name in ("enabled", "steps", "lr", "grad_accum",
                                                                      "eval_every")),
    "stage2.rank",
)
LR_FIELDS = ("stage1.lr", "stage2.lr")  # typed as text (1e-3), so a widget shows them with :g


def form_values(config: dict[str, Any]) -> dict[str, Any]:
    """Widget values (keyed like the form's widgets: the fields' dotted paths) showing ``config``;
    a field ``config`` lacks (a job stored before the field existed) shows its default."""
    config = deep_merge(ConvertConfig().model_dump(), config)
    values = {path: get_dotted(config, path) for path in FIELDS}
    values["data.max_examples"] = values["data.max_examples"] or 0
    values["attention.softmax_layers"] = _layers_text(values["attention.softmax_layers"])
    if values["attention.softmax_budget"] is None:
        values["attention.softmax_budget"] = DEFAULT_BUDGET
    for path in LR_FIELDS:
        values[path] = f"{values[path]:g}"
    model_choice, model_path = _model_choice(config["model"]["source"])
    data_choice, data_path = _data_choice(config["data"]["source"])
    return {"model_choice": model_choice, "model_path": model_path, "data_choice": data_choice,
            "data_path": data_path, **values}


def _float(text: Any, field: str, problems: list[tuple[str, str]]) -> Any:
    try:
        value = float(str(text).strip())
    except ValueError:
        problems.append((field, f"must be a number such as 1e-3, got {text!r}"))
        return None
    return value  # nan / inf pass through: the config rejects them with its own message


def _layers_text(layers: list[int] | str) -> str:
    return AUTO if layers == AUTO else ", ".join(str(i) for i in layers)


def is_auto(text: Any) -> bool:
    """Whether the softmax-layers entry asks for ``auto`` (any case, surrounding spaces ignored)."""
    return str(text).strip().lower() == AUTO


def _layers(text: str, problems: list[tuple[str, str]]) -> list[int] | str | None:
    """``"auto"`` (any case), the comma-separated layer numbers, or None with a problem."""
    if is_auto(text):
        return AUTO
    try:
        return comma_ints(text)
    except ValueError:
        problems.append(("attention.softmax_layers",
                         f"must be {AUTO} alone, or layer numbers separated by commas such as 0, 15; got {text!r}"))
        return None


def _softmax_fields(values: dict[str, Any], problems: list[tuple[str, str]]) -> dict[str, Any]:
    """The ``attention`` fields of the softmax layers: with ``auto`` its budget, with a list no
    budget (the config refuses a budget without ``auto``), nothing when the entry is bad."""
    layers = _layers(values["attention.softmax_layers"], problems)
    if layers is None:
        return {}
    if layers != AUTO:
        return {"softmax_layers": layers, "softmax_budget": None}
    return {"softmax_layers": AUTO, "softmax_budget": int(values["attention.softmax_budget"])}


def build(preset: str, values: dict[str, Any], base: dict[str, Any] | None = None
          ) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """Merge the form ``values`` (keyed as :func:`form_values` keys them) into the preset, or into
    ``base`` (a whole config: a job's, or one loaded from YAML, whose fields outside the form it
    keeps); returns ``(config dict, parse problems)``."""
    problems: list[tuple[str, str]] = []
    choice = values["model_choice"]
    if choice == "bundled":
        model_source = BUNDLED_MODEL
    elif choice == "tiny":
        model_source = TINY_MODEL
    else:
        model_source = str(values.get("model_path") or "").strip()
        if not model_source:
            what = "a hub id such as HuggingFaceTB/SmolLM2-135M-Instruct" if choice == "hub" else "a folder path"
            problems.append(("model.source", f"enter {what}, or pick the bundled model"))
    data_choice = values["data_choice"]
    if data_choice in ("gsm8k", "kjv-sample"):
        data_source = data_choice
    else:
        data_source = str(values.get("data_path") or "").strip()
        if not data_source:
            problems.append(("data.source", "enter a dataset id or a file path, or pick a bundled dataset"))
    form = {"model": {"source": model_source or BUNDLED_MODEL}, "data": {"source": data_source or "gsm8k"}}
    for path in FIELDS:
        form = set_dotted(form, path, values[path])
    form["data"]["max_examples"] = int(values["data.max_examples"]) or None
    del form["attention"]["softmax_layers"], form["attention"]["softmax_budget"]
    form["attention"].update(_softmax_fields(values, problems))
    for path in LR_FIELDS:
        stage = path.split(".")[0]
        lr = _float(values[path], path, problems)
        if lr is None:
            del form[stage]["lr"]
        else:
            form[stage]["lr"] = lr
    return deep_merge(base if base is not None else preset_config(preset), form), problems


def from_yaml(raw: bytes | str, what: str, workspace=None) -> tuple[dict[str, Any] | None, list[tuple[str, str]]]:
    """A config from YAML text (``preset:`` and any fields over it, as ``lolcats convert`` reads a
    file): the validated config dict, or None and its problems as :func:`validate` gives them."""
    try:
        fields = config_fields(parse_yaml_mapping(raw, what), what)
    except ConfigError as exc:
        return None, [("config", str(exc))]
    validated, problems = validate(fields, workspace)
    return (validated.model_dump() if validated is not None else None), problems


def validate(config: dict[str, Any], workspace=None) -> tuple[ConvertConfig | None, list[tuple[str, str]]]:
    """The validated config, or None and every problem as ``(dotted field, message)``; a config
    that does not fit its model (read from the model's config.json) or whose data cannot be read
    (its first rows) is refused as the job queue refuses it."""
    try:
        validated = ConvertConfig.model_validate(config)
    except ValidationError as exc:
        return None, validation_problems(exc)
    try:
        check_conversion(validated, workspace)
    except (ModelFitError, DataSourceError) as exc:
        return None, [(exc.field, exc.problem)]
    return validated, []
