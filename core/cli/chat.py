"""``lolcats chat``: the same prompt to teacher and student, in the terminal."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import typer

from core.cli.common import WorkspaceOpt, cli_errors, console


@cli_errors()
def chat(
    run: Path = typer.Argument(..., help="Run folder or exported folder."),
    max_new_tokens: int = typer.Option(128, help="Tokens to generate per answer."),
    dtype: Optional[str] = typer.Option(None, help="Run teacher and student in this dtype (float32, bfloat16, "
                                        "float16; the half precisions hold the weights in half the memory). "
                                        "Default: the run's."),
    workspace: Optional[Path] = WorkspaceOpt,
) -> None:
    """Terminal chat: each prompt goes to the teacher and to the student (the student alone when an
    export's base model, its teacher, cannot be loaded)."""
    from contextlib import nullcontext

    from core.eval.metrics import chat_prompt, generate_text, teacher_context
    from core.export.teacher import teacher_problem
    from core.load import load_converted

    model, tokenizer, _ = load_converted(run, workspace=workspace, dtype=dtype)
    unavailable = teacher_problem(model)  # an export whose base model cannot be loaded
    if unavailable:
        console.print(f"[yellow]teacher unavailable:[/yellow] {unavailable}; only the student answers.", highlight=False)
    answerers = [("student", nullcontext)] if unavailable else [("teacher", lambda: teacher_context(model)),
                                                                 ("student", nullcontext)]
    console.print("Type a message (empty line or Ctrl-D to quit).")
    while True:
        try:
            message = console.input("[bold]you> [/bold]").strip()
        except EOFError:
            break
        except UnicodeDecodeError:  # a terminal in another encoding, read strictly
            console.print("[yellow]that line is not UTF-8 text[/yellow]; type it again", highlight=False)
            continue
        if not message:
            break
        if _undecodable(message):
            message = message.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
            console.print("[yellow]bytes that are not UTF-8 were replaced by \ufffd[/yellow]", highlight=False)
        prompt = chat_prompt(tokenizer, message)
        for name, context in answerers:
            t0 = time.perf_counter()
            with context():
                answer = generate_text(model, tokenizer, prompt, max_new_tokens)
            console.print(f"[cyan]{name}[/cyan] ({time.perf_counter() - t0:.1f}s): {answer}", highlight=False)


def _undecodable(text: str) -> bool:
    """Whether ``text`` carries bytes that were not UTF-8 (read with ``surrogateescape``, as Python
    reads standard input under a C or POSIX locale): lone surrogates, which no tokenizer accepts."""
    return any("\udc80" <= ch <= "\udcff" for ch in text)
