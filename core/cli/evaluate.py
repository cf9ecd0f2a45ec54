"""``lolcats eval``: held-out perplexity, per-layer attention MSE and quality by context length
(``--lengths``, against the untrained sliding-window baselines, with the passkey grid) of a
converted model, or, with ``--tasks``, task accuracy of teacher and student through lm-evaluation-harness.

Without ``--tasks`` it runs the conversion's own evaluation step again (:func:`core.pipeline.convert.evaluate_again`)
on the loaded model, under the run's own eval settings with the flags given as dotted overrides of
them (``--set`` takes any), less what needs the run's training data (validation perplexity, sample
answers); prints a short summary (teacher and student perplexity, their ratio, passkey accuracy
over the grid), the long-context tables and verdicts, and writes the whole report, per-layer
values included, as JSON (default ``<run>/eval.json``). ``--passkey-grid-trials`` is the former
name of ``--passkey-trials``.
With ``--tasks``: prints one row per task (teacher, student, paired difference and its 95% interval)
and writes :func:`core.eval.harness.evaluate_tasks`'s result JSON (default ``<run>/tasks.json``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from core.cli.common import SET_HELP, RichProgress, WorkspaceOpt, cli_errors, console
from core.eval.long_context_result import LongContextResult, passkey_accuracy, read_long_context
from core.lists import comma_ints
from core.run_folder import EVAL_FILE, TASKS_FILE

OUTCOME_STYLES = {"worse": "bold red", "level": "yellow", "better": "green"}


def summary_table(report: dict) -> Table:
    """Teacher and student perplexity, their ratio and passkey accuracy over the grid
    (:func:`core.eval.long_context_result.passkey_accuracy`; ``-``: not measured)."""
    key = passkey_accuracy(report)
    table = Table(show_header=True)
    for column in ("", "teacher", "student"):
        table.add_column(column, justify="right" if column else "left")
    teacher_ppl, ratio = (f"{report[k]:.3f}" if report[k] is not None else "-" for k in ("teacher_ppl", "ppl_ratio"))
    table.add_row("held-out perplexity", teacher_ppl, f"{report['student_ppl']:.3f}")
    table.add_row("ppl ratio (student / teacher)", "", ratio)
    table.add_row("passkey accuracy", *(f"{key[m]:.0%}" if key else "-" for m in ("teacher", "student")))
    return table


def _table(title: str | None, header: list[str], rows: list[list[str]]) -> Table:
    table = Table(title=title)
    for column in header:
        table.add_column(column, justify="right")
    for cells in rows:
        table.add_row(*cells)
    return table


def long_context_tables(section: LongContextResult) -> list[Table]:
    """Quality by length, the frontier by length and by position bucket (student and baselines as
    ratios to the teacher's perplexity), and the passkey grid when there is one."""
    header, rows = section.length_table()
    tables = [_table(f"perplexity / teacher's by context length ({section.text}, {section.sequences} sequence(s); "
                     f"trained on {section.train_seq_len})", header,
                     [[str(n), f"{t:.3f}", *(f"{r:.3f}" for r in ratios), f"{agree:.0%}"]
                      for n, t, *ratios, agree in rows])]
    header, rows = section.frontier_table()
    if rows:
        tables.append(_table("against the training-free frontier (untrained sliding windows by their bytes per layer)",
                             header, [[str(n), *(f"{r:.3f}" for r in ratios), verdict,
                                       "-" if equal is None else f"{equal:,.0f}"]
                                      for n, *ratios, verdict, equal in rows]))
    names = ["student", *section.baselines]
    titles = ["student", *(b.label for b in section.baselines.values())]
    tables.append(_table("by position of the predicted token", ["positions", "teacher ppl", *titles],
                         [[f"{row.start}-{row.end}", f"{row.teacher_ppl:.3f}",
                           *(f"{row.ratios[n]:.3f}" if n in row.ratios else "-" for n in names)]
                          for row in section.by_position]))
    key = section.passkey
    if key:
        models = section.passkey_models()
        grid = _table(f"passkey keys found of {key.trials} a cell (length x depth of the key in the prompt): "
                      f"{' / '.join(t for _, t in models)}",
                      ["length \\ depth", *(f"{d:g}" for d in key.depths)],
                      [[str(n), *(" / ".join(str(round(key.accuracy[m][i][j] * key.trials)) for m, _ in models)
                                  for j in range(len(key.depths)))] for i, n in enumerate(key.lengths)])
        tables.append(grid)
    return tables


def parse_lengths(text: str | None) -> list[int] | str | None:
    """``--lengths``: None (the run's settings), ``off``, ``auto`` or comma-separated token counts."""
    if text is None or text in ("auto", "off"):
        return text
    try:
        return comma_ints(text, "--lengths")
    except ValueError as exc:
        raise typer.BadParameter(f"{exc}, 'auto' or 'off'") from None


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
    ppl_blocks: Optional[int] = typer.Option(None, "--ppl-blocks", "--blocks", min=1, help="Held-out blocks for "
                                             "perplexity (default: the run's eval.ppl_blocks; --blocks is the old "
                                             "name)."),
    seq_len: Optional[int] = typer.Option(None, help="Block length for perplexity (default: the run's data.seq_len)."),
    passkey_trials: Optional[int] = typer.Option(None, min=0, help="Passkey keys per length and depth of the "
                                                 "passkey grid, measured with quality by context length (default: "
                                                 "the run's eval.long_context.passkey_trials; 0: no passkey grid)."),
    former_passkey_trials: Optional[int] = typer.Option(None, "--passkey-grid-trials", min=0, hidden=True,
                                                        help="The former name of --passkey-trials."),
    tasks: Optional[str] = typer.Option(None, "--tasks", help="Task accuracy instead: comma-separated lm-eval task "
                                        "names (piqa,arc_easy,...), 'paper' (the LoLCATs suite) or 'offline' (the "
                                        "bundled tasks, no network)."),
    num_fewshot: Optional[int] = typer.Option(None, "--num-fewshot", min=0, help="With --tasks: few-shot examples "
                                              "for every task (default: the task's own; 'paper' uses 5 for MMLU)."),
    limit: Optional[int] = typer.Option(None, "--limit", min=1, help="With --tasks: at most N items per task."),
    batch_size: int = typer.Option(1, "--batch-size", min=1, help="With --tasks: lm-eval batch size."),
    lengths: Optional[str] = typer.Option(None, "--lengths", help="Context lengths for quality by length against "
                                          "the sliding-window baselines and the frontier, e.g. 256,1024,2048,4096; "
                                          "'auto' (up to 8x the training length) or 'off' (default: the run's "
                                          "eval.long_context)."),
    sequences: Optional[int] = typer.Option(None, "--sequences", min=1, help="Held-out sequences of the longest "
                                            "length (default: the run's eval.long_context.sequences)."),
    sets: list[str] = typer.Option([], "--set", help=SET_HELP + " Applies to the run's own config before measuring "
                                   "(eval.* and data.eval_text are what an evaluation reads)."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help=f"JSON report (default: RUN/{EVAL_FILE}, "
                                          f"with --tasks RUN/{TASKS_FILE})."),
    workspace: Optional[Path] = WorkspaceOpt,
) -> None:
    """Held-out perplexity of teacher and student, per-layer attention MSE and quality by context
    length against the training-free frontier, with the passkey grid; with --tasks, task accuracy
    of both through lm-evaluation-harness."""
    if tasks is not None:
        from core.eval.harness import evaluate_tasks

        with RichProgress() as progress:
            report = evaluate_tasks(run, tasks, num_fewshot=num_fewshot, limit=limit, batch_size=batch_size,
                                    output=output or run / TASKS_FILE, progress=progress, workspace=workspace)
        console.print(tasks_table(report))
        console.print(f"report: {output or run / TASKS_FILE}")
        return
    from core.config import evaluation_overrides
    from core.export.teacher import teacher_problem
    from core.io import atomic_write_json
    from core.pipeline.convert import evaluate_again
    from core.load import load_converted

    passkey_trials = former_passkey_trials if passkey_trials is None else passkey_trials
    overrides = [*evaluation_overrides(seq_len=seq_len, ppl_blocks=ppl_blocks, lengths=parse_lengths(lengths),
                                       sequences=sequences, passkey_trials=passkey_trials), *sets]
    model, tokenizer, info = load_converted(run, workspace=workspace)
    with RichProgress() as progress:
        unavailable = teacher_problem(model)  # an export whose base model cannot be loaded
        report = evaluate_again(model, tokenizer, info["config"], overrides, progress, teacher_unavailable=unavailable)
    path = atomic_write_json(output or run / EVAL_FILE, report)
    if unavailable:
        console.print(f"[yellow]teacher unavailable:[/yellow] {unavailable}", highlight=False)
    console.print(summary_table(report))
    section = read_long_context(report)
    if section:
        for table in long_context_tables(section):
            console.print(table)
        for outcome, line in section.verdict_lines():
            console.print(f"{line[:1].upper()}{line[1:]}.", style=OUTCOME_STYLES[outcome], highlight=False)
        console.print(section.margin_note(), highlight=False)
    console.print(f"report: {path}")
