"""Core commands of the ``lolcats`` CLI: convert, eval, export, chat, ablate.

    lolcats convert [CONFIG.yaml] [--preset NAME] [--output DIR] [--resume]
    lolcats eval RUN_OR_EXPORT [--blocks N]
    lolcats export RUN OUT
    lolcats chat RUN_OR_EXPORT [--max-new-tokens N]
    lolcats ablate [--preset NAME] [--steps N] [--kinds linear,terraced]

Relative output paths live under ``<workspace>/runs``; a path that escapes the workspace is
refused. User errors print one line naming the cause and the fix and exit with status 1.
"""

from __future__ import annotations

import functools
import json
import time
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

console = Console()
WorkspaceOpt = typer.Option(None, "--workspace", "-w", help="Workspace folder (default: $LOLCATS_WORKSPACE or ./workspace).")


class RichProgress:
    """Renders core progress callbacks as one progress bar per stage."""

    def __init__(self):
        self.bars = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                             TextColumn("{task.fields[metrics]}"), TimeRemainingColumn(), console=console)
        self.tasks: dict[str, int] = {}

    def __enter__(self):
        self.bars.__enter__()
        return self

    def __exit__(self, *exc):
        self.bars.__exit__(*exc)

    def on_step(self, stage, step, total, metrics, layer_metrics=None):
        if stage not in self.tasks:
            self.tasks[stage] = self.bars.add_task(stage, total=total, metrics="")
        shown = "  ".join(f"{k}={v:.4g}" for k, v in list(metrics.items())[:3])
        self.bars.update(self.tasks[stage], completed=step, total=total, metrics=shown)

    def on_log(self, message):
        self.bars.console.log(message)

    def should_stop(self):
        return False


def user_errors(fn):
    """Known user errors become one red line and exit status 1."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from core.errors import USER_ERRORS

        try:
            return fn(*args, **kwargs)
        except USER_ERRORS as e:
            console.print(f"[red]error:[/red] {e}", highlight=False)
            raise typer.Exit(1)

    return wrapper


def run_path(output: Optional[str], workspace: Optional[Path], default_name: str) -> Path:
    from core.workspace import runs_dir, safe_child, workspace_root

    root = workspace_root(workspace)
    target = output or f"{default_name}-{time.strftime('%Y%m%d-%H%M%S')}"
    if Path(target).is_absolute():
        return safe_child(root, target)
    return safe_child(runs_dir(root), target)


def register(app: typer.Typer) -> None:
    """Add the core commands to the top-level app."""

    @app.command()
    @user_errors
    def convert(
        config: Optional[Path] = typer.Argument(None, help="YAML config (sections: model, data, attention, stage1, stage2, eval)."),
        preset: Optional[str] = typer.Option(None, "--preset", "-p", help="paper-8b | cpu-demo | tiny-test"),
        output: Optional[str] = typer.Option(None, "--output", "-o", help="Run folder (relative: under <workspace>/runs)."),
        resume: bool = typer.Option(False, "--resume", help="Continue a stopped or crashed run in --output."),
        workspace: Optional[Path] = WorkspaceOpt,
    ):
        """Convert a model: attention transfer, then LoRA, then evaluation (writes report.json)."""
        from core.config import load_config
        from core.pipeline.convert import run_convert

        cfg = load_config(config, preset)
        out = run_path(output, workspace, preset or "run")
        with RichProgress() as progress:
            report = run_convert(cfg, out, progress, resume=resume, workspace=workspace)
        console.print_json(json.dumps({k: report[k] for k in ("teacher_ppl", "student_ppl", "ppl_ratio", "val_ppl")}))
        console.print(f"report: {out / 'report.json'}")

    @app.command("eval")
    @user_errors
    def evaluate(
        run: Path = typer.Argument(..., help="Run folder or exported folder."),
        preset: Optional[str] = typer.Option(None, "--preset", help="Take eval settings from this preset instead of the run."),
        blocks: int = typer.Option(8, help="Held-out blocks for perplexity."),
        seq_len: int = typer.Option(256, help="Block length for perplexity."),
        workspace: Optional[Path] = WorkspaceOpt,
    ):
        """Held-out perplexity of teacher and student and per-layer attention MSE."""
        from core.config import build_config
        from core.pipeline.convert import eval_text_blocks
        from core.eval.metrics import per_layer_mse, perplexity, teacher_context
        from core.pipeline.runs import load_converted

        model, tokenizer, info = load_converted(run, workspace=workspace)
        cfg = build_config({"data": {"seq_len": seq_len}, "eval": {"ppl_blocks": blocks}})
        eval_blocks = eval_text_blocks(cfg, tokenizer)
        with RichProgress() as progress:
            student = perplexity(model, eval_blocks, progress=progress, stage="student")
            with teacher_context(model):
                teacher = perplexity(model, eval_blocks, progress=progress, stage="teacher")
            mse = per_layer_mse(model, eval_blocks, min(blocks, 2))
        console.print_json(json.dumps({"teacher_ppl": teacher, "student_ppl": student, "ppl_ratio": student / teacher,
                                       "per_layer_mse": mse}))

    @app.command()
    @user_errors
    def export(
        run: Path = typer.Argument(..., help="Run folder."),
        out: Path = typer.Argument(..., help="Folder for the standalone model (LoRA merged)."),
        workspace: Optional[Path] = WorkspaceOpt,
    ):
        """Export a standalone folder with LoRA merged; `lolcats chat/eval` and core.load_converted read it."""
        from core.pipeline.runs import export as export_run

        console.print(f"exported to {export_run(run, out, workspace=workspace)}")

    @app.command()
    @user_errors
    def chat(
        run: Path = typer.Argument(..., help="Run folder or exported folder."),
        max_new_tokens: int = typer.Option(128, help="Tokens to generate per answer."),
        workspace: Optional[Path] = WorkspaceOpt,
    ):
        """Terminal chat: each prompt goes to the teacher and to the student."""
        from core.eval.metrics import chat_prompt, generate_text, teacher_context
        from core.pipeline.runs import load_converted

        model, tokenizer, _ = load_converted(run, workspace=workspace)
        console.print("Type a message (empty line or Ctrl-D to quit).")
        while True:
            try:
                message = console.input("[bold]you> [/bold]").strip()
            except EOFError:
                break
            if not message:
                break
            prompt = chat_prompt(tokenizer, message)
            for name, ctx in (("teacher", teacher_context(model)), ("student", None)):
                t0 = time.perf_counter()
                if ctx is None:
                    answer = generate_text(model, tokenizer, prompt, max_new_tokens)
                else:
                    with ctx:
                        answer = generate_text(model, tokenizer, prompt, max_new_tokens)
                console.print(f"[cyan]{name}[/cyan] ({time.perf_counter() - t0:.1f}s): {answer}", highlight=False)

    @app.command()
    @user_errors
    def bench(
        model: str = typer.Option("smollm2-135m-instruct", "--model", "-m", help="Model source."),
        checkpoint: Optional[Path] = typer.Option(None, "--checkpoint", help="Converted run to measure instead of a fresh conversion."),
        batch_sizes: str = typer.Option("1,2,4,8", help="Comma-separated batch sizes."),
        prompt_lengths: str = typer.Option("512,1024,2048,4096", help="Comma-separated prompt lengths."),
        gen_lengths: str = typer.Option("8", help="Comma-separated generation lengths."),
        threads: Optional[int] = typer.Option(None, help="torch threads during the sweep."),
        output: Path = typer.Option(Path("bench.json"), "--output", "-o", help="JSON result file."),
        workspace: Optional[Path] = WorkspaceOpt,
    ):
        """Throughput (tokens/s) and peak memory, teacher vs student, prefill and decode."""
        from core.bench import BenchConfig, run_benchmark, write_result

        ints = lambda text: [int(x) for x in text.split(",") if x.strip()]  # noqa: E731
        cfg = BenchConfig(model=model, student_checkpoint=str(checkpoint) if checkpoint else None,
                          batch_sizes=ints(batch_sizes), prompt_lengths=ints(prompt_lengths),
                          gen_lengths=ints(gen_lengths), threads=threads,
                          workspace=str(workspace) if workspace else None)
        with RichProgress() as progress:
            result = run_benchmark(cfg, progress)
        console.print(f"written: {write_result(result, output)}")

    @app.command()
    @user_errors
    def ablate(
        preset: str = typer.Option("cpu-demo", "--preset", "-p", help="Base config preset."),
        config: Optional[Path] = typer.Option(None, "--config", help="YAML overriding the preset."),
        steps: Optional[int] = typer.Option(None, help="Total training steps per variant (default: stage1 + stage2 steps)."),
        kinds: str = typer.Option("linear,terraced", help="Comma-separated attention kinds."),
        output: Optional[str] = typer.Option(None, "--output", "-o"),
        resume: bool = typer.Option(False, "--resume"),
        workspace: Optional[Path] = WorkspaceOpt,
    ):
        """Table 2 protocol: swap / transfer only / LoRA only / both, at equal total steps."""
        from core.pipeline.ablation import markdown_table, run_ablation
        from core.config import load_config

        cfg = load_config(config, preset)
        out = run_path(output, workspace, "ablation")
        with RichProgress() as progress:
            result = run_ablation(cfg, out, kinds=[k.strip() for k in kinds.split(",")], total_steps=steps,
                                  progress=progress, resume=resume, workspace=workspace)
        console.print(markdown_table(result["rows"]))
        console.print(f"written: {out / 'ablation.md'}, {out / 'ablation.json'}")
