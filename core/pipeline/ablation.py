"""The paper's Table 2 protocol: which of attention transfer and LoRA matter, at equal total steps.

For each attention kind, four runs from the same base model and data:

    swap        convert, no training
    transfer    stage 1 only, N steps
    lora        stage 2 only, N steps
    both        stage 1 for N/2 steps, then stage 2 for N/2 steps

and their perplexities (validation split and held-out text). Writes ``ablation.json`` and
``ablation.md`` in the output folder.
"""

from __future__ import annotations

import math
from pathlib import Path

from core.config import ConvertConfig
from core.io import atomic_write_json
from core.pipeline.convert import run_convert
from core.progress import NullProgress, ProgressCallback

VARIANTS = ("swap", "transfer", "lora", "both")


def variant_config(base: ConvertConfig, kind: str, variant: str, total_steps: int) -> ConvertConfig:
    half = max(total_steps // 2, 1)
    s1 = {"swap": 0, "transfer": total_steps, "lora": 0, "both": half}[variant]
    s2 = {"swap": 0, "transfer": 0, "lora": total_steps, "both": total_steps - half}[variant]
    data = base.model_dump()
    data["attention"]["kind"] = kind
    data["stage1"].update(enabled=s1 > 0, steps=max(s1, 1), eval_every=min(data["stage1"]["eval_every"], max(s1, 1)))
    data["stage2"].update(enabled=s2 > 0, steps=max(s2, 1), eval_every=min(data["stage2"]["eval_every"], max(s2, 1)))
    data["eval"]["samples"] = 0
    data["eval"]["long_context"]["passkey_trials"] = 0
    return ConvertConfig.model_validate(data)


def run_ablation(base: ConvertConfig, output: str | Path, kinds=("linear", "terraced"), total_steps: int | None = None,
                 progress: ProgressCallback | None = None, resume: bool = False, workspace=None) -> dict:
    progress = progress or NullProgress()
    output = Path(output)
    output.mkdir(parents=True, exist_ok=True)
    total = total_steps or base.stage1.steps + base.stage2.steps
    rows = []
    for kind in kinds:
        for variant in VARIANTS:
            config = variant_config(base, kind, variant, total)
            progress.on_log(f"ablation: {kind} / {variant}")
            report = run_convert(config, output / f"{kind}-{variant}", progress, resume=resume, workspace=workspace)
            rows.append({
                "attention": kind, "variant": variant,
                "stage1_steps": config.stage1.steps if config.stage1.enabled else 0,
                "stage2_steps": config.stage2.steps if config.stage2.enabled else 0,
                "val_ppl": report["val_ppl"], "heldout_ppl": report["student_ppl"], "teacher_heldout_ppl": report["teacher_ppl"],
            })
    result = {"total_steps": total, "rows": rows}
    atomic_write_json(output / "ablation.json", result)
    (output / "ablation.md").write_text(markdown_table(rows))
    return result


def markdown_table(rows: list[dict]) -> str:
    lines = ["| attention | variant | stage 1 steps | stage 2 steps | val ppl | held-out ppl |",
             "|---|---|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['attention']} | {r['variant']} | {r['stage1_steps']} | {r['stage2_steps']} | "
                     f"{_fmt(r['val_ppl'])} | {_fmt(r['heldout_ppl'])} |")
    if rows:
        lines.append(f"\nTeacher held-out perplexity: {_fmt(rows[0]['teacher_heldout_ppl'])}")
    return "\n".join(lines) + "\n"


def _fmt(x: float) -> str:
    return f"{x:.2f}" if math.isfinite(x) and x < 1e6 else f"{x:.3g}"


__all__ = ["run_ablation", "variant_config", "markdown_table", "VARIANTS"]
