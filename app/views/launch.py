"""Launch: configure a conversion (model, data, attention, stage budgets, presets) and queue it.

The form starts from a preset, from a YAML config (uploaded or pasted, read as ``lolcats convert``
reads a file) or from an earlier job's config (the Jobs page's "New conversion from this job");
with a YAML config or a job's, the fields outside the form keep its values. The config is
validated on every change; each problem is shown under its section and in the check panel, and
the launch button stays disabled until there is none; a valid config can be downloaded as YAML.
Nothing runs here: the job goes to the queue, a worker runs it, and the Jobs page shows it.
"""

from __future__ import annotations

import json

import streamlit as st
import yaml

from app import common, forms
from core.config import PRESET_DESCRIPTIONS, AttentionSpec, DataSpec, ModelSpec, field_choices
from core.pipeline.phases import unlisted_phases
from jobs import api
from jobs.errors import JobsError

P = "launch_"  # key prefix: a form field's widget is P + the field (a dotted path, forms.FIELDS) + "~" + the filling
_FORM = "launchform"  # the form's values by field: plain session state, so they survive page switches
_FILLED = "launchfilled"  # how many times the form was filled from a config (a preset, YAML, a job)
_BASE = "launchbase"  # {"label", "config"}: the whole config the form edits, instead of the preset's
_PICK = "launchpreset_"  # + the preset shown: the preset box's key
Y = "launchyaml_"  # keys of widgets not saved with the form (an upload or a button cannot be restored)


def _default_preset() -> str:
    try:
        import torch

        if torch.cuda.is_available():
            return forms.RECIPE
    except Exception:  # noqa: BLE001 - no torch, no GPU
        pass
    return common.DEMO_PRESET


# Streamlit keeps what the browser last reported for a widget. A widget whose value is assigned
# through session state can be redrawn by the browser from its declared default (a new session's
# first page cut short by the next run) and report that default back, silently undoing a filled
# form. So every field widget declares the form's own value as its default and is keyed by the
# filling too: filling the form makes new widgets instead of assigning to existing ones.


def _show(config: dict) -> None:
    """Fill the form from ``config``."""
    st.session_state[_FORM] = forms.form_values(config)
    st.session_state[_FILLED] = st.session_state.get(_FILLED, 0) + 1


def _key(field: str) -> str:
    return f"{P}{field}~{st.session_state[_FILLED]}"


def _value(field: str):
    return st.session_state[_FORM][field]


def _bound(field: str) -> dict:
    """The arguments that tie a value widget (number, text, checkbox) to form ``field``."""
    return {"value": _value(field), "key": _key(field)}


def _index(options: list, field: str) -> int:
    return options.index(_value(field))


def _sync() -> None:
    """The values the widgets of this filling reported (this run's input) into the form."""
    form = st.session_state[_FORM]
    for field in form:
        if _key(field) in st.session_state:
            form[field] = st.session_state[_key(field)]


def _apply_preset() -> None:
    st.session_state.pop(_BASE, None)
    _show(forms.preset_config(st.session_state[P + "preset"]))


def _pick_preset(box: str) -> None:
    """The preset box's change: a preset other than the shown one refills the form. The box also
    reports the shown one when a run that drew it first was cut short by the next (a new session's
    first page): that is no change, and the form keeps a config loaded meanwhile."""
    if st.session_state[box] != st.session_state[P + "preset"]:
        st.session_state[P + "preset"] = st.session_state[box]
        _apply_preset()


def _use_base(label: str, config: dict) -> None:
    """Fill the form from a whole loaded config; the preset box names the preset nearest to it."""
    st.session_state[_BASE] = {"label": label, "config": config}
    st.session_state[P + "preset"] = forms.closest_preset(config)
    _show(config)


def _load_yaml() -> None:
    """The Load button: the uploaded file, else the pasted text, becomes the form's base config."""
    upload = st.session_state.get(Y + "file")
    raw, what = (upload.getvalue(), f"the uploaded file {upload.name}") if upload is not None else (
        st.session_state.get(Y + "text", ""), "the pasted config")
    config, problems = forms.from_yaml(raw, what, common.workspace())
    st.session_state[Y + "problems"] = problems
    if config is not None:
        _use_base(what.removeprefix("the "), config)


def _linked_job() -> dict | None:
    """The config of the job the page was linked with (``?from_job=<id>``, the Jobs page's "New
    conversion from this job"), read once: the parameter leaves the address."""
    raw = st.query_params.get(common.FROM_JOB)
    if raw is None:
        return None
    del st.query_params[common.FROM_JOB]
    try:
        job = api.get_job(int(raw), **common.ws())
    except (ValueError, JobsError):
        st.warning(f"There is no job {raw!r} to start from: the form keeps its own values.")
        return None
    return {"label": f"job #{job.id}{' ' + job.name if job.name else ''}", "config": job.config}


def _init_state() -> None:
    if _FORM not in st.session_state:  # the first visit
        st.session_state[P + "preset"] = _default_preset()
        _apply_preset()
    _sync()
    opened = st.session_state.pop(common.LAUNCH_FROM, None) or _linked_job()
    if opened is not None:
        _use_base(opened["label"], opened["config"])


def _problems_for(section: str, problems: list[tuple[str, str]]) -> None:
    for field, message in problems:
        if field == section or field.startswith(section + "."):
            st.error(f"**{field}**: {message}", icon=":material/error:")


def _source(label: str, choices: dict[str, str], key: str, named: dict[str, tuple[str, str]]) -> None:
    """A radio of source choices (``<key>_choice``) and, for a choice in ``named`` (hub id, local
    path), a text input ``<key>_path`` with that choice's ``(label, placeholder)``."""
    field = key + "_choice"
    choice = st.radio(label, list(choices), index=_index(list(choices), field), key=_key(field),
                      format_func=choices.get, horizontal=True)
    if choice in named:
        text, placeholder = named[choice]
        st.text_input(text, placeholder=placeholder, **_bound(key + "_path"))


def _select(where, label: str, options: list, field: str, **kw):
    return where.selectbox(label, options, index=_index(options, field), key=_key(field), **kw)


def _number(where, label: str, field: str, **kw):
    return where.number_input(label, **_bound(field), **kw)


def _stage_budget(stage: str, title: str, lr_help: str, problems, lora_rank: bool = False) -> None:
    """The budget inputs of ``stage`` (``stage1`` or ``stage2``) and its problems."""
    st.checkbox(title, **_bound(f"{stage}.enabled"))
    a, b = st.columns(2)
    _number(a, "Steps", f"{stage}.steps", step=10)
    b.text_input("Learning rate", help=lr_help, **_bound(f"{stage}.lr"))
    _number(a, "Gradient accumulation", f"{stage}.grad_accum", step=1)
    if lora_rank:
        _number(b, "LoRA rank", f"{stage}.rank", step=1, help="recipe 8 (alpha 16)")
    _number(b, "Validate every", f"{stage}.eval_every", step=10)
    _problems_for(stage, problems)


def _yaml_loader() -> None:
    """Upload or paste a YAML config (``preset:`` and fields over it) to start the form from."""
    with st.expander("Start from a YAML config", icon=":material/upload_file:"):
        st.file_uploader("YAML file", type=["yaml", "yml"], key=Y + "file")
        st.text_area("or paste it", key=Y + "text", height=120, placeholder="preset: cpu-demo\nattention:\n  window_size: 32")
        st.button("Load", key=Y + "load", on_click=_load_yaml, icon=":material/input:")
        for field, message in st.session_state.get(Y + "problems", []):
            st.error(f"**{field}**: {message}", icon=":material/error:")


def _base_notice() -> None:
    base = st.session_state.get(_BASE)
    if base is not None:
        st.info(f"Based on **{base['label']}**: the fields outside this form keep its values.", icon=":material/info:")
        st.button("Back to the preset", key=Y + "base_clear", on_click=_apply_preset)


def _form(problems) -> None:
    described = {**PRESET_DESCRIPTIONS, forms.RECIPE: "the paper's Llama 3 8B recipe values"}
    # The preset itself is plain session state (P + "preset"); its box is keyed by the preset it
    # shows and drawn with that index, so a box the browser redraws from its default shows the
    # same preset instead of reporting the first one as a change (which would refill the form).
    names, current = forms.preset_names(), st.session_state[P + "preset"]
    st.selectbox("Preset", names, index=names.index(current), key=_PICK + current, on_change=_pick_preset,
                 args=(_PICK + current,), help="Fills every field below; edit any of them afterwards.")
    if _BASE not in st.session_state:  # else the form shows the loaded config, not the preset
        st.caption(described[st.session_state[P + "preset"]])
    _base_notice()
    _yaml_loader()

    st.subheader("Model")
    _source("Teacher model", forms.MODEL_CHOICES, "model", {
        "hub": ("Hub id", "HuggingFaceTB/SmolLM2-360M-Instruct"), "local": ("Folder or .gguf path", "/models/my-llama")})
    c1, c2 = st.columns(2)
    _select(c1, "dtype", field_choices(ModelSpec, "dtype"), "model.dtype")
    devices = field_choices(ModelSpec, "device")  # and a device name a loaded config gives (cuda:1)
    shown = _value("model.device")
    _select(c2, "Device", [*devices, shown] if shown not in devices else devices, "model.device",
            help="auto: CUDA when present, else CPU")

    st.subheader("Data")
    _source("Training data", forms.DATA_CHOICES, "data", {
        "hub": ("Dataset id", "yahma/alpaca-cleaned"), "local": ("File path", "data/my_rows.jsonl")})
    c1, c2, c3, c4 = st.columns(4)
    _select(c1, "Format", field_choices(DataSpec, "format"), "data.format")
    _number(c2, "Sequence length", "data.seq_len", step=64, help="packed block length (recipe 1024)")
    _number(c3, "Max examples (0 = all)", "data.max_examples", step=100)
    _number(c4, "Validation rows", "data.val_examples", step=8, help="the first rows (recipe 200)")
    _problems_for("data", problems)
    _problems_for("model", problems)

    st.subheader("Attention")
    c1, c2, c3, c4 = st.columns(4)
    _select(c1, "Kind", field_choices(AttentionSpec, "kind"), "attention.kind",
            help="terraced: the recipe's tiled window (tk); sliding_window: last w keys; linear: no window")
    _select(c2, "Feature map", field_choices(AttentionSpec, "feature_map"), "attention.feature_map",
            help="hedgehog: [softmax(xW), softmax(-xW)]; t2r: relu(xW + b)")
    _number(c3, "Feature dim", "attention.feature_dim", step=8, help="hedgehog f (F = 2f); recipe 64")
    _number(c4, "Window", "attention.window_size", step=16, help="window / tile length; recipe 64")
    c1, c2 = st.columns([3, 1])
    _number(c2, "Sink tokens", "attention.sink_tokens", min_value=0, step=1,
            help="the first tokens stay in every query's softmax window, never linear (attention sinks); "
                 "the paper uses 0")
    layers = c1.text_input(
        "Layers kept as softmax", placeholder="e.g. 0, 15, or auto", **_bound("attention.softmax_layers"),
        help="comma-separated layer indices that keep their original attention (hybrid model), or "
             f"{forms.AUTO}: after stage 1 every converted layer is scored and the highest-scoring ones get "
             "their softmax attention back")
    if forms.is_auto(layers):
        c1, c2 = st.columns(2)
        _number(c1, "Layers to keep softmax", "attention.softmax_budget", min_value=0, step=1,
                help=f"how many of the highest-scoring layers stay softmax (default {forms.DEFAULT_BUDGET})")
        _select(c2, "Score", field_choices(AttentionSpec, "softmax_score"), "attention.softmax_score",
                help="; ".join(f"{name}: {text}" for name, text in forms.SCORE_HELP.items()))
    _problems_for("attention", problems)
    _problems_for("config", problems)  # checks across sections (window vs sequence length)

    st.subheader("Stage budgets")
    c1, c2 = st.columns(2)
    with c1:
        _stage_budget("stage1", "Stage 1: attention transfer", "recipe 1e-2", problems)
    with c2:
        _stage_budget("stage2", "Stage 2: LoRA fine-tuning", "recipe 1e-4", problems, lora_rank=True)


def main() -> None:
    st.title("Launch a conversion")
    st.caption("Softmax attention → LoLCATs linear / sliding-window hybrid: stage 1 trains the feature maps to "
               "match each layer's attention output, stage 2 fine-tunes with LoRA. The job runs in the "
               "background; watch it on the Jobs page.")
    _init_state()
    # Widget values are in session state before the page runs, so the check comes first and the
    # form can show each problem under its section.
    values = {**st.session_state[_FORM], "preset": st.session_state[P + "preset"]}
    config, problems = _check(values)
    left, right = st.columns([3, 2], gap="large")
    with left:
        _form(problems)
    with right:
        _panel(config, problems)


def _check(values: dict):
    base = st.session_state.get(_BASE)
    try:
        config, problems = forms.build(values["preset"], values, base["config"] if base else None)
    except (KeyError, TypeError, ValueError) as exc:
        return None, [("form", str(exc))]
    validated, config_problems = forms.validate(config, common.workspace())
    problems = problems + config_problems
    return (validated.model_dump() if validated is not None and not problems else config), problems


def _softmax_summary(attention: dict) -> str:
    """The softmax layers of the Check panel's attention line ("" when every layer is converted)."""
    if attention["softmax_layers"] == forms.AUTO:
        return f", softmax layers: auto (budget {attention['softmax_budget']}, by {attention['softmax_score']})"
    return f", softmax layers {attention['softmax_layers']}" if attention["softmax_layers"] else ""


def _estimate(config: dict) -> str:
    """The Check panel's wall-time line: measured here, or why there is none yet."""
    found = common.wall_time_estimate(config)
    if found is None:
        return (f"- wall time: no estimate yet (no conversion of {config['model']['source']} in "
                f"{config['model']['dtype']} has finished in this workspace)")
    seconds, measured = found
    extra = unlisted_phases(config)
    then = f", plus {extra}" if extra else ""
    return (f"- wall time: about **{common.fmt_duration(seconds)}** for the training and perplexity phases (model "
            f"loading aside) at the pace {measured} measured here{then}")


def _panel(config: dict | None, problems: list[tuple[str, str]]) -> None:
    with st.container(border=True):
        st.subheader("Check")
        if problems:
            st.error(f"{len(problems)} problem(s): fix them to launch.", icon=":material/error:")
            for field, message in problems:
                st.markdown(f"- **{field}**: {message}")
        else:
            m, a, s1, s2 = config["model"], config["attention"], config["stage1"], config["stage2"]
            st.success("The config is valid.", icon=":material/check_circle:")
            window = "" if a["kind"] == "linear" else f", window {a['window_size']}"
            window += f", {a['sink_tokens']} sink tokens" if a.get("sink_tokens") else ""
            softmax = _softmax_summary(a)
            st.markdown(
                f"- model **{m['source']}** ({m['dtype']}, {m['device']})\n"
                f"- data **{config['data']['source']}**, {config['data']['seq_len']} tokens per block\n"
                f"- attention **{a['kind']}**, {a['feature_map']} feature dim {a['feature_dim']}{window}{softmax}\n"
                f"- stage 1: {s1['steps'] if s1['enabled'] else 'off'} steps · stage 2: "
                f"{s2['steps'] if s2['enabled'] else 'off'} steps (LoRA rank {s2['rank']})")
            st.markdown(_estimate(config))
        name = st.text_input("Run name (optional)", key=P + "submit_name", placeholder="my-conversion")
        if st.button("Launch conversion", type="primary", disabled=bool(problems), key=P + "submit",
                     icon=":material/rocket_launch:"):
            common.queue_and_show(common.CONVERT, config, name.strip() or None,
                                  lambda job: f"Queued conversion job #{job.id}.")
        common.worker_hint(common.list_jobs(status=common.ACTIVE))
        if config is not None:
            if not problems:
                st.download_button("Download config (YAML)", yaml.safe_dump(config, sort_keys=False),
                                   file_name=f"{name.strip() or 'conversion'}.yaml", mime="application/x-yaml",
                                   key=Y + "download", icon=":material/download:")
            with st.expander("Full config (what the job stores)"):
                st.code(json.dumps(config, indent=2), language="json")


main()
