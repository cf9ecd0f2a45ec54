"""Wall time of the cpu-demo conversion (the bundled SmolLM2-135M-Instruct: stage 1, stage 2 and the
evaluation) against the README's bound of 15 minutes on 2 CPU cores.

Runs ``core.run_convert`` on the cpu-demo preset in a fresh workspace and prints one JSON object:

    .venv/bin/python benchmarks/cpu_demo.py               # the preset: about 15 minutes on 2 idle cores
    .venv/bin/python benchmarks/cpu_demo.py --scale 0.1   # a smoke run: a tenth of the steps and blocks

Fields: ``wall_s`` (the conversion, run_convert's call to its return, the bundled model already
cached in the workspace), ``model_cache_s`` (dequantising the bundled GGUF into the workspace, once
per workspace, before that), ``target_s`` (900) and ``wall_over_target`` (their ratio: at most 1
meets the bound, meaningful at ``--scale 1`` only), the report's own per-phase ``timings``,
``teacher_ppl`` / ``student_ppl`` / ``ppl_ratio``, ``long_context_by_length`` (the ratios of the
student and each baseline by length) and ``long_context`` (the report's whole section: by position,
the frontier and its verdicts, the passkey grid, the state's bytes), the steps run, torch threads
and the load average before and after. A full run also writes benchmarks/results/cpu-demo-timing.json (``--out``).

Run it on an otherwise idle machine: with two torch threads every parallel op waits for a
descheduled sibling when other processes are busy, and the times say more about the load than
about the conversion (the load averages in the output show it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # ahead of benchmarks/, whose kernels.py would shadow the kernels package

import torch

import core
from core.config import preset
from core.config.loading import preset_fields
from core.io import atomic_write_json
from core.models.gguf import bundled_model_dir

PRESET = "cpu-demo"
TARGET_S = 15 * 60  # README: the cpu-demo preset finishes within 15 minutes on 2 CPU cores
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "cpu-demo-timing.json"
SCALED = {  # the preset's counts that --scale shrinks (each stays at least 1)
    "stage1": ("steps", "eval_every", "eval_blocks"),
    "stage2": ("steps", "eval_every", "eval_blocks"),
    "eval": ("ppl_blocks", "mse_blocks", "samples"),
}


def scaled_sections(scale: float) -> dict[str, dict[str, int]]:
    """The preset's step and block counts times ``scale`` (rounded, at least 1)."""
    fields = preset_fields(PRESET)
    return {section: {name: max(1, round(fields[section][name] * scale)) for name in names}
            for section, names in SCALED.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=float, default=1.0, help="fraction of the preset's steps and eval blocks")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads (default 2: the bound's cores)")
    parser.add_argument("--workspace", type=Path, help="workspace to convert in (default: a fresh temporary one)")
    parser.add_argument("--out", type=Path, help=f"JSON output (default for --scale 1: {DEFAULT_OUT})")
    parser.add_argument("--run-dir", type=Path, help="keep the run folder here (default: a temporary one)")
    args = parser.parse_args(argv)
    if not 0 < args.scale <= 1:
        parser.error("--scale must be in (0, 1]")
    torch.set_num_threads(args.threads)
    out = args.out or (DEFAULT_OUT if args.scale == 1 else None)
    config = preset(PRESET, **(scaled_sections(args.scale) if args.scale < 1 else {}))

    with tempfile.TemporaryDirectory(prefix="cpu-demo-") as tmp:
        workspace = args.workspace or Path(tmp)
        load_start = os.getloadavg()[0]
        started = time.perf_counter()
        bundled_model_dir(workspace)
        model_cache_s = time.perf_counter() - started
        started = time.perf_counter()
        report = core.run_convert(config, args.run_dir or Path(tmp) / "run", workspace=workspace)
        wall_s = time.perf_counter() - started

    result = {
        "preset": PRESET,
        "scale": args.scale,
        "wall_s": round(wall_s, 1),
        "model_cache_s": round(model_cache_s, 1),
        "target_s": TARGET_S,
        "wall_over_target": round(wall_s / TARGET_S, 3),
        "timings": {name: round(seconds, 1) for name, seconds in report["timings"].items()},
        "teacher_ppl": report["teacher_ppl"],
        "student_ppl": report["student_ppl"],
        "ppl_ratio": report["ppl_ratio"],
        "long_context_by_length": [{"length": row["length"], **{name: row[name]["ratio"] for name in row
                                                               if isinstance(row[name], dict)}}
                                   for row in report.get("long_context", {}).get("by_length", [])],
        "long_context": report.get("long_context"),
        "steps": {stage: report["training"][stage]["steps"] for stage in ("stage1", "stage2")},
        "seq_len": config.data.seq_len,
        "torch_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "load_average": {"start": load_start, "end": os.getloadavg()[0]},
    }
    print(json.dumps(result, indent=2))
    if out is not None:
        atomic_write_json(out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
