"""``lolcats eval``: held-out perplexity, per-layer attention MSE, passkey retrieval and quality by
context length (``--lengths``, against the untrained sliding-window baselines) of a converted model,
or, with ``--tasks``, task accuracy of teacher and student through lm-evaluation-harness.

Without ``--tasks`` it runs a conversion's own evaluation step (:func:`core.pipeline.convert.evaluate_run`)
on the loaded model, less what needs the run's training data (validation perplexity, sample answers),
prints a short summary (teacher and student perplexity, their ratio, passkey
accuracy) and writes the whole report, per-layer values included, as JSON (default ``<run>/eval.json``).
With ``--tasks``: prints one row per task (teacher, student, paired difference and its 95% interval)
and writes :func:`core.eval.harness.evaluate_tasks`'s result JSON (default ``<run>/tasks.json``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from core.cli.common import RichProgress, WorkspaceOpt, cli_errors, console

EVAL_FILE = "eval.json"
TASKS_FILE = "tasks.json"


def summary_table(report: dict) -> Table:
    """Teacher and student perplexity, their ratio and passkey accuracy (``-``: not measured)."""
    key = report["passkey"]
    table = Table(show_header=True)
    for column in ("", "teacher", "student"):
        table.add_column(column, justify="right" if column else "left")
    teacher_ppl, ratio = (f"{report[k]:.3f}" if report[k] is not None else "-" for k in ("teacher_ppl", "ppl_ratio"))
    table.add_row("held-out perplexity", teacher_ppl, f"{report['student_ppl']:.3f}")
    table.add_row("ppl ratio (student / teacher)", "", ratio)
    table.add_row("passkey accuracy", *(f"{key[f'{m}_accuracy']:.0%}" if key else "-" for m in ("teacher", "student")))
    return table


def long_context_tables(section: dict) -> list[Table]:
    """Quality by length and by position bucket, student and baselines as ratios to the teacher's
    perplexity, and the passkey grid when there is one."""
    names = ["student", *section["baselines"]]
    titles = {"student": "student", **{n: b["label"] for n, b in section["baselines"].items()}}
    by_length = Table(title=f"perplexity / teacher's by context length ({section['text']}, "
                            f"{section['sequences']} sequence(s); trained on {section['train_seq_len']})")
    for column in ("length", "teacher ppl", *(titles[n] for n in names), "top-1 agreement"):
        by_length.add_column(column, justify="right")
    for row in section["by_length"]:
        by_length.add_row(str(row["length"]), f"{row['teacher_ppl']:.3f}", *(f"{row[n]['ratio']:.3f}" for n in names),
                          f"{row['student']['top1_agreement']:.0%}")
    by_position = Table(title="by position of the predicted token")
    for column in ("positions", "teacher ppl", *(titles[n] for n in names)):
        by_position.add_column(column, justify="right")
    for row in section["by_position"]:
        by_position.add_row(f"{row['start']}-{row['end']}", f"{row['teacher_ppl']:.3f}",
                            *(f"{row[n]:.3f}" for n in names))
    tables = [by_length, by_position]
    key = section.get("passkey")
    if key:
        grid = Table(title=f"passkey accuracy ({key['trials']} trials a cell): teacher / student / "
                           f"{section['baselines']['window']['label']}")
        grid.add_column("length \\ depth", justify="right")
        for depth in key["depths"]:
            grid.add_column(f"{depth:g}", justify="right")
        acc = key["accuracy"]
        for i, n in enumerate(key["lengths"]):
            grid.add_row(str(n), *(" / ".join(f"{acc[m][i][j]:.0%}" for m in ("teacher", "student", "window"))
                                   for j in range(len(key["depths"]))))
        tables.append(grid)
    return tables


def parse_lengths(text: str | None) -> list[int] | str | None:
    """``--lengths``: None (the run's settings), ``off``, ``auto`` or comma-separated token counts."""
    if text is None or text in ("auto", "off"):
        return text
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise typer.BadParameter(f"--lengths takes 'auto', 'off' or comma-separated token counts, got {text!r}")


def tasks_table(report: dict) -> Table:
    """One row per evaluated task or group: items, headline metric, teacher, student, diff [95% CI],
    in percent (``-``: not measured)."""
    table = Table(title="task scores (%)", show_header=True)
    for column in ("task", "n", "metric", "teacher", "student", "diff [95% CI]"):
        table.add_column(column, justify="left" if column in ("task", "metric") else "right")
    for name, entry in report["results"].items():
        metric = entry["metric"]
        ci = entry["diff_ci95"]
        diff = percent(entry["diff"], "+") + (f" [{percent(ci[0], '+')}, {percent(ci[1], '+')}]" if ci else "")
        table.add_row(name, str(entry["n"]), metric or "-", percent(entry["teacher"].get(metric)),
                      percent(entry["student"].get(metric)), diff)
    return table


def percent(value: float | None, sign: str = "") -> str:
    """``value`` (a fraction) in percent with one decimal, ``-`` for None; ``sign="+"`` shows the sign."""
    return "-" if value is None else f"{100 * value:{sign}.1f}"


@cli_errors()
def evaluate(
    run: Path = typer.Argument(..., help="Run folder or exported folder."),
    ppl_blocks: int = typer.Option(16, "--ppl-blocks", "--blocks", min=1, help="Held-out blocks for perplexity "
                                   "(eval.ppl_blocks; --blocks is the old name)."),
    seq_len: int = typer.Option(256, help="Block length for perplexity."),
    passkey_trials: Optional[int] = typer.Option(None, min=0, help="Passkey trials per length and depth (default: "
                                                 "the run's eval settings; 0 skips the passkey test)."),
    tasks: Optional[str] = typer.Option(None, "--tasks", help="Task accuracy instead: comma-separated lm-eval task "
                                        "names (piqa,arc_easy,...), 'paper' (the LoLCATs suite) or 'offline' (the "
                                        "bundled tasks, no network)."),
    num_fewshot: Optional[int] = typer.Option(None, "--num-fewshot", min=0, help="With --tasks: few-shot examples "
                                              "for every task (default: the task's own; 'paper' uses 5 for MMLU)."),
    limit: Optional[int] = typer.Option(None, "--limit", min=1, help="With --tasks: at most N items per task."),
    batch_size: int = typer.Option(1, "--batch-size", min=1, help="With --tasks: lm-eval batch size."),
    lengths: Optional[str] = typer.Option(None, "--lengths", help="Context lengths for quality by length against "
                                          "the sliding-window baselines, e.g. 256,1024,2048,4096; 'auto' (up to 8x "
                                          "the training length) or 'off' (default: the run's eval.long_context)."),
    sequences: Optional[int] = typer.Option(None, "--sequences", min=1, help="Held-out sequences of the longest "
                                            "length (default: the run's eval.long_context.sequences)."),
    grid_trials: Optional[int] = typer.Option(None, "--passkey-grid-trials", min=0, help="Passkey keys per length "
                                              "and depth of the long-context grid (0: no grid)."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help=f"JSON report (default: RUN/{EVAL_FILE}, "
                                          f"with --tasks RUN/{TASKS_FILE})."),
    workspace: Optional[Path] = WorkspaceOpt,
) -> None:
    """Held-out perplexity of teacher and student, per-layer attention MSE and passkey retrieval;
    with --tasks, task accuracy of both through lm-evaluation-harness."""
    if tasks is not None:
        from core.eval.harness import evaluate_tasks

        with RichProgress() as progress:
            report = evaluate_tasks(run, tasks, num_fewshot=num_fewshot, limit=limit, batch_size=batch_size,
                                    output=output or run / TASKS_FILE, progress=progress, workspace=workspace)
        console.print(tasks_table(report))
        console.print(f"report: {output or run / TASKS_FILE}")
        return
    from core.config import build_config
    from core.eval.metrics import perplexity, teacher_context
    from core.export.teacher import teacher_problem
    from core.io import atomic_write_json
    from core.pipeline.convert import eval_text_blocks, evaluate_run
    from core.pipeline.runs import load_converted
    from core.run_folder import TEACHER_EVAL

    long_lengths = parse_lengths(lengths)
    model, tokenizer, info = load_converted(run, workspace=workspace)
    run_config = info.get("config", {})  # the run's own settings (an export keeps its run's)
    overrides = {} if passkey_trials is None else {"passkey_trials": passkey_trials}
    long = dict(run_config.get("eval", {}).get("long_context", {}))
    if long_lengths == "off":
        long["enabled"] = False
    elif long_lengths is not None:
        long.update(lengths=long_lengths, enabled=True)
    long.update({k: v for k, v in (("sequences", sequences), ("passkey_trials", grid_trials)) if v is not None})
    train_seq_len = run_config.get("data", {}).get("seq_len", seq_len)
    cfg = build_config({"seed": run_config.get("seed", 0), "data": {"seq_len": seq_len},
                        "eval": {**run_config.get("eval", {}), "ppl_blocks": ppl_blocks,
                                 "mse_blocks": min(ppl_blocks, 2), **overrides, "long_context": long}})
    eval_blocks = eval_text_blocks(cfg, tokenizer)
    with RichProgress() as progress:
        unavailable = teacher_problem(model)  # an export whose base model cannot be loaded
        teacher = None
        if unavailable is None:
            with teacher_context(model):
                teacher = perplexity(model, eval_blocks, progress=progress, stage=TEACHER_EVAL)
        # the run's own evaluation step, less what needs its training data (validation blocks, sample prompts)
        report = evaluate_run(model, tokenizer, cfg, eval_blocks, None, teacher, progress, train_seq_len=train_seq_len,
                              with_passkey=bool(cfg.eval.passkey_trials) and unavailable is None,
                              with_long_context=unavailable is None, with_samples=False)
    long_section = report.setdefault("long_context", None)
    report.update({"teacher_unavailable": unavailable,
                   "eval": cfg.eval.model_dump(exclude={"samples", "max_new_tokens"}), "seq_len": seq_len})
    path = atomic_write_json(output or run / EVAL_FILE, report)
    if unavailable:
        console.print(f"[yellow]teacher unavailable:[/yellow] {unavailable}", highlight=False)
    console.print(summary_table(report))
    if long_section:
        for table in long_context_tables(long_section):
            console.print(table)
        for line in long_section["verdict"]:
            console.print(line, style="bold red" if "WORSE" in line else "green", highlight=False)
    console.print(f"report: {path}")
