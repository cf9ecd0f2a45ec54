"""``lolcats bench``: throughput and peak memory, teacher against student.

Each option is a :class:`core.bench.config.BenchConfig` field of the same name, and its default
is the field's: the lists are written comma-separated.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer

from core.bench.config import MODELS, BenchConfig
from core.cli.common import RichProgress, WorkspaceOpt, cli_errors, console
from core.config import DTYPES
from core.lists import comma_ints, comma_names


def _default(name: str) -> Any:
    """The ``BenchConfig`` field's default, a list written comma-separated."""
    value = BenchConfig.model_fields[name].get_default(call_default_factory=True)
    return ",".join(str(v) for v in value) if isinstance(value, list) else value


@cli_errors()
def bench(
    model: str = typer.Option(_default("model"), "--model", "-m", help="Model source."),
    checkpoint: Optional[Path] = typer.Option(None, "--checkpoint", help="Converted run to measure instead of a fresh conversion."),
    batch_sizes: str = typer.Option(_default("batch_sizes"), help="Comma-separated batch sizes."),
    prompt_lengths: str = typer.Option(_default("prompt_lengths"), help="Comma-separated prompt lengths."),
    gen_lengths: str = typer.Option(_default("gen_lengths"), help="Comma-separated generation lengths."),
    threads: Optional[int] = typer.Option(_default("threads"), help="torch threads during the sweep."),
    dtype: str = typer.Option(_default("dtype"), help=f"Weights' dtype: {', '.join(DTYPES)} (the 16-bit ones halve "
                              "the weights' memory; the speed depends on the hardware's support)."),
    models: str = typer.Option(_default("models"), help=f"Comma-separated models: {', '.join(MODELS)} "
                               "(floor: the teacher with attention costing nothing)."),
    memory_budget: Optional[str] = typer.Option(_default("memory_budget"), "--memory-budget", help="A capacity run "
                                                "instead of a sweep: the largest batch of teacher and student whose "
                                                "decode peak fits this size (e.g. 12GiB, 500MiB) at each prompt "
                                                "length, and its decode throughput."),
    capacity_steps: int = typer.Option(_default("capacity_steps"), help="Timed decode steps per capacity trial."),
    output: Path = typer.Option(Path("bench.json"), "--output", "-o", help="JSON result file."),
    workspace: Optional[Path] = WorkspaceOpt,
) -> None:
    """Throughput (tokens/s) and peak memory, teacher vs student, prefill and decode."""
    from core.bench import run_benchmark, write_result
    from core.config import build_spec

    cfg = build_spec(BenchConfig, {
        "model": model, "student_checkpoint": str(checkpoint) if checkpoint else None,
        "batch_sizes": comma_ints(batch_sizes, "--batch-sizes"), "prompt_lengths": comma_ints(prompt_lengths,
                                                                                               "--prompt-lengths"),
        "gen_lengths": comma_ints(gen_lengths, "--gen-lengths"), "threads": threads, "dtype": dtype,
        "models": comma_names(models),
        "memory_budget": memory_budget, "capacity_steps": capacity_steps,
        "workspace": str(workspace) if workspace else None})
    with RichProgress() as progress:
        result = run_benchmark(cfg, progress)
    console.print(f"written: {write_result(result, output)}")
