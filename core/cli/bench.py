"""``lolcats bench``: throughput and peak memory, teacher against student."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from core.cli.common import RichProgress, WorkspaceOpt, cli_errors, console


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


@cli_errors()
def bench(
    model: str = typer.Option("smollm2-135m-instruct", "--model", "-m", help="Model source."),
    checkpoint: Optional[Path] = typer.Option(None, "--checkpoint", help="Converted run to measure instead of a fresh conversion."),
    batch_sizes: str = typer.Option("1,2,4,8", help="Comma-separated batch sizes."),
    prompt_lengths: str = typer.Option("512,1024,2048,4096", help="Comma-separated prompt lengths."),
    gen_lengths: str = typer.Option("8", help="Comma-separated generation lengths."),
    threads: Optional[int] = typer.Option(None, help="torch threads during the sweep."),
    dtype: str = typer.Option("float32", help="Weights' dtype: float32, bfloat16 or float16 (half the weights' "
                              "memory; the speed depends on the hardware's support)."),
    models: str = typer.Option("teacher,student,floor", help="Comma-separated models: teacher, student, floor "
                               "(the teacher with attention costing nothing)."),
    memory_budget: Optional[str] = typer.Option(None, "--memory-budget", help="A capacity run instead of a sweep: "
                                                "the largest batch of teacher and student whose decode peak fits this "
                                                "size (e.g. 12GiB, 500MiB) at each prompt length, and its decode throughput."),
    capacity_steps: int = typer.Option(3, help="Timed decode steps per capacity trial."),
    output: Path = typer.Option(Path("bench.json"), "--output", "-o", help="JSON result file."),
    workspace: Optional[Path] = WorkspaceOpt,
) -> None:
    """Throughput (tokens/s) and peak memory, teacher vs student, prefill and decode."""
    from core.bench import BenchConfig, run_benchmark, write_result

    cfg = BenchConfig(model=model, student_checkpoint=str(checkpoint) if checkpoint else None,
                      batch_sizes=_ints(batch_sizes), prompt_lengths=_ints(prompt_lengths),
                      gen_lengths=_ints(gen_lengths), threads=threads, dtype=dtype,
                      models=[m.strip() for m in models.split(",") if m.strip()],
                      memory_budget=memory_budget, capacity_steps=capacity_steps,
                      workspace=str(workspace) if workspace else None)
    with RichProgress() as progress:
        result = run_benchmark(cfg, progress)
    console.print(f"written: {write_result(result, output)}")
