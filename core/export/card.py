"""The model card (``README.md``) of an export: what it is, how it was made, how well it does, how to load it.

Written from the run folder: ``config.json`` (the conversion), ``report.json`` (teacher and
student perplexity, per-layer attention MSE, passkey accuracy over the grid, task scores and
quality by context length when present, timings) and the stage summaries. Training tokens are
optimizer steps x batch size x gradient accumulation x ``data.seq_len`` per stage. Hub front
matter: ``license`` (when known), ``base_model`` (hub ids only), ``library_name: transformers``
and tags.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from core.config import ConvertConfig, stored_attention, stored_config
from core.config.constants import BUNDLED_MODEL, GEMMA3_MODEL, TINY_MODEL
from core.eval.long_context_result import LongContextResult, passkey_accuracy, read_long_context
from core.models.sources import resolve_source
from core.run_folder import REPORT_FILE

CARD_FILE = "README.md"
KNOWN_BASES = {  # bundled sources: (what they are, license)
    BUNDLED_MODEL: ("HuggingFaceTB/SmolLM2-135M-Instruct (the bundled Q4_1 GGUF, dequantised)", "apache-2.0"),
    GEMMA3_MODEL: ("google/gemma-3-270m (the bundled Q4_K_M GGUF, dequantised)", "gemma"),
    TINY_MODEL: ("a 2-layer random Llama for tests (no pretrained weights)", None),
}


def _front_matter_license(readme: Path | None) -> str | None:
    """``license:`` of a model card's YAML front matter."""
    if readme is None or not readme.is_file():
        return None
    lines = readme.read_text(errors="replace").splitlines()
    if not lines or lines[0].strip() != "---":
        return None
    for line in lines[1:]:
        if line.strip() == "---":
            break
        if line.startswith("license:"):
            return line.split(":", 1)[1].strip().strip("'\"") or None
    return None


def base_model_license(source: str) -> str | None:
    """The base model's license when it can be known offline: bundled sources, a local folder's
    README.md front matter, or the README.md of a hub model already in the Hugging Face cache."""
    if source in KNOWN_BASES:
        return KNOWN_BASES[source][1]
    resolved = resolve_source(source)
    if resolved.kind == "folder":
        return _front_matter_license(Path(resolved.path) / "README.md")
    if resolved.kind == "hub":
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(resolved.repo_id, "README.md")
        return _front_matter_license(Path(cached) if isinstance(cached, str) else None)
    return None


def training_tokens(config: ConvertConfig) -> dict[str, int]:
    """Tokens each enabled stage trained on (steps x batch x accumulation x seq_len)."""
    return {name: spec.steps * spec.batch_size * spec.grad_accum * config.data.seq_len
            for name, spec in (("stage1", config.stage1), ("stage2", config.stage2)) if spec.enabled}


def _mse_summary(per_layer: list[float | None], softmax_layers: list[int]) -> str:
    """Mean, median and worst of the converted layers' MSE (softmax layers have none, or 0 in older reports)."""
    converted = [(i, v) for i, v in enumerate(per_layer) if i not in softmax_layers and v is not None]
    if not converted:
        return "no converted layers"
    worst = max(converted, key=lambda iv: iv[1])
    values = [v for _, v in converted]
    return (f"{len(values)} converted layers: mean {statistics.fmean(values):.3g}, median {statistics.median(values):.3g},"
            f" max {worst[1]:.3g} (layer {worst[0]})")


def _task_rows(tasks: dict) -> list[str]:
    rows = []
    for name, result in (tasks.get("results") or {}).items():
        metric = result.get("metric")
        teacher, student = result.get("teacher", {}).get(metric), result.get("student", {}).get(metric)
        if teacher is not None and student is not None:
            rows.append(f"| {name} ({metric}, n={result.get('n')}) | {teacher:.3f} | {student:.3f} |")
    return rows


def _markdown_table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |",
            *("| " + " | ".join(cells) + " |" for cells in rows)]


def _long_context(section: LongContextResult | None) -> list[str]:
    """The "Quality by context length" part of the card: the table by length, the frontier by
    length and the verdicts (a worse one in bold)."""
    if section is None:
        return []
    header, rows = section.length_table()
    lines = ["## Quality by context length", "",
             f"Perplexity over the teacher's (lower is better; 1.000 = as good as the teacher) on {section.text}, "
             f"{section.sequences} held-out sequence(s); trained on {section.train_seq_len}-token blocks. "
             "The baselines are the teacher's own softmax attention over a window of recent keys plus sink tokens, "
             "untrained.", "",
             *_markdown_table(header, [[str(length), f"{teacher:.3f}", *(f"{r:.3f}" for r in ratios), f"{agree:.0%}"]
                                       for length, teacher, *ratios, agree in rows]), ""]
    header, rows = section.frontier_table()
    if rows:
        lines += ["### Against the training-free frontier", "",
                  f"The same untrained window at several sizes, each at its key/value bytes per layer; the student "
                  f"holds {section.frontier.student_bytes:,} bytes per layer. The curve is read at the student's "
                  "bytes (linear in log bytes and log ratio between the two nearest windows); the last column is "
                  "the bytes a window needs for the student's quality.", "",
                  *_markdown_table(header, [[str(length), *(f"{r:.3f}" for r in ratios), verdict,
                                             "-" if equal is None else f"{equal:,.0f}"]
                                            for length, *ratios, verdict, equal in rows]), ""]
    lines += [f"- **{text}**" if outcome == "worse" else f"- {text}" for outcome, text in section.verdict_lines()]
    lines.append(f"- {section.margin_note()}")
    return [*lines, ""]


def _history(spec: dict) -> str:
    """The linear history's options in words (a spec written before a field reads as it was trained)."""
    spec = stored_attention(spec)
    return (f"{spec.history_norm}, gate {spec.history_gate}, key feature maps per "
            f"{'key/value' if spec.key_map_heads == 'kv' else 'query'} head, on q and k "
            f"{'before' if spec.feature_positions == 'none' else 'after'} RoPE")


def model_card(run_dir: Path, base: dict, spec: dict, folder_name: str) -> str:
    """The card's Markdown; ``base`` as :func:`core.export.teacher.base_model_metadata`, ``spec``
    the attention spec, ``folder_name`` the export's name in the loading snippet."""
    config = stored_config(json.loads((run_dir / "config.json").read_text()))
    report_file = run_dir / REPORT_FILE
    report = json.loads(report_file.read_text()) if report_file.is_file() else {}
    source = base["source"]
    license_ = base_model_license(source)
    hub = resolve_source(source).kind == "hub"
    front = ["---", "library_name: transformers", "tags:", "- lolcats", "- linear-attention", "- custom_code"]
    front += [f"license: {license_}"] if license_ else []
    front += [f"base_model: {source}"] if hub else []
    front.append("---")

    described = KNOWN_BASES.get(source, (source, None))[0]
    revision = f" at revision `{base['revision']}`" if base.get("revision") else ""
    lines = [*front, "", f"# {folder_name}: LoLCATs conversion of {described}", "",
             f"Base model: `{source}`{revision} ({base.get('dtype')}); license: {license_ or 'unknown (see the base model)'}.",
             "", "Softmax attention replaced by LoLCATs attention (sliding-window / terraced softmax plus linear attention "
             "with learned feature maps, one normaliser), trained by attention transfer and LoRA, then merged.", "",
             "## Conversion", "", "| setting | value |", "| --- | --- |",
             f"| attention kind | {spec['kind']} (window {spec['window_size']}, "
             f"{spec.get('sink_tokens', 0)} sink tokens) |",
             f"| feature map | {spec['feature_map']}, feature_dim {spec['feature_dim']}, init {spec['feature_init']} |",
             f"| history | {_history(spec)} |",
             f"| softmax layers kept | {spec['softmax_layers'] or 'none'} |",
             f"| stage 1 (attention transfer) | {_stage(config.stage1)} |",
             f"| stage 2 (LoRA, merged) | {_stage(config.stage2)}, rank {config.stage2.rank}, "
             f"targets {', '.join(config.stage2.target_modules) or 'none (feature maps and history only)'} |",
             f"| data | {config.data.source} ({config.data.format}), seq_len {config.data.seq_len} |", ""]
    tokens = training_tokens(config)
    timings = report.get("timings", {})
    lines += ["## Training", "", f"Tokens: {', '.join(f'{k} {v:,}' for k, v in tokens.items()) or 'none'} "
              f"({sum(tokens.values()):,} in all)."]
    if timings:
        spent = ", ".join(f"{name.removesuffix('_s')} {seconds:.1f} s" for name, seconds in timings.items())
        lines.append(f"Time: {spent}.")
    lines.append("")
    lines += _evaluation(report, spec)
    lines += ["## Loading", "", "With plain transformers (the folder carries its modeling code, `modeling_lolcats.py`, "
              "generated from the LoLCATs Workbench source; it depends only on torch and transformers):", "",
              "```python", "from transformers import AutoModelForCausalLM, AutoTokenizer", "",
              f'model = AutoModelForCausalLM.from_pretrained("{folder_name}", trust_remote_code=True)',
              f'tokenizer = AutoTokenizer.from_pretrained("{folder_name}")', "```", "",
              "With the workbench: `core.load_converted(folder)`, `lolcats eval folder`, `lolcats chat folder` "
              "(these also load the base model as the teacher).", "",
              "## Limits", "",
              "- The exported code runs the PyTorch form of the attention (no Triton kernels); the workbench's loader "
              "uses its Triton kernels on CUDA.",
              "- Greedy and sampled `generate` work with the default cache; assisted decoding, cache cropping and "
              "static or offloaded caches do not (the converted layers keep a recurrent state).",
              "- Quality is what the numbers above say, on the workbench's own held-out text; a short conversion is "
              "not a substitute for the base model.", ""]
    return "\n".join(lines)


def _stage(spec) -> str:
    if not spec.enabled:
        return "skipped"
    return f"{spec.steps} steps, lr {spec.lr:g}, batch {spec.batch_size} x {spec.grad_accum}"


def _evaluation(report: dict, spec: dict) -> list[str]:
    if not report:
        return ["## Evaluation", "", "The run folder has no report.json (the conversion did not finish its evaluation).", ""]
    lines = ["## Evaluation", "", "| | teacher | student |", "| --- | --- | --- |",
             f"| held-out perplexity | {report['teacher_ppl']:.3f} | {report['student_ppl']:.3f} |",
             f"| ratio (student / teacher) | | {report['ppl_ratio']:.3f} |"]
    key = passkey_accuracy(report)
    if key:
        lines.append(f"| passkey accuracy | {key['teacher']:.0%} | {key['student']:.0%} |")
    lines += _task_rows(report.get("tasks") or {})
    lines += ["", f"Per-layer attention-output MSE (student vs teacher): "
              f"{_mse_summary(report.get('per_layer_mse', []), spec['softmax_layers'])}.", ""]
    return lines + _long_context(read_long_context(report))


__all__ = ["CARD_FILE", "base_model_license", "model_card", "training_tokens"]
