"""The command line of the benchmarks that measure one finished run into a JSON and render its table:
``--run RUN [--workspace WS]`` measures (then renders), ``--render`` rewrites the table from the JSON.
A benchmark that keeps several runs (``labelled``) takes ``--label NAME`` as well: the run's
measurement replaces that label's in the JSON and leaves the other labels' as they are."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Callable


def run_or_render(doc: str, measure: Callable[..., dict], render: Callable[[dict], str], json_out: Path,
                  md_out: Path, argv: list[str] | None = None, labelled: bool = False) -> int:
    """Parse ``argv``; with ``--run``, write ``measure(run, workspace)`` to ``json_out`` (``labelled``:
    ``measure(run, workspace, label)`` under ``label`` in the JSON's object of runs); then write
    ``render`` of ``json_out`` to ``md_out`` and print it."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--run", help="the finished run folder to measure")
    parser.add_argument("--workspace", default=os.environ.get("LOLCATS_WORKSPACE", "workspace"))
    parser.add_argument("--render", action="store_true", help="rewrite the Markdown table from the JSON")
    if labelled:
        parser.add_argument("--label", default="cpu-demo", help="the run's name in the JSON, beside the other runs'")
    args = parser.parse_args(argv)
    if args.run and labelled:
        runs = json.loads(json_out.read_text()) if json_out.is_file() else {}
        runs[args.label] = measure(args.run, args.workspace, args.label)
        json_out.write_text(json.dumps(runs, indent=1) + "\n")
    elif args.run:
        json_out.write_text(json.dumps(measure(args.run, args.workspace), indent=1) + "\n")
    elif not args.render:
        parser.error("nothing to do: give --run or --render")
    md_out.write_text(render(json.loads(json_out.read_text())))
    print(md_out.read_text())
    return 0
