"""The command line of the benchmarks that measure one finished run into a JSON and render its table:
``--run RUN [--workspace WS]`` measures (then renders), ``--render`` rewrites the table from the JSON."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Callable


def run_or_render(doc: str, measure: Callable[[str, str], dict], render: Callable[[dict], str], json_out: Path,
                  md_out: Path, argv: list[str] | None = None) -> int:
    """Parse ``argv``; with ``--run``, write ``measure(run, workspace)`` to ``json_out``; then write
    ``render`` of ``json_out`` to ``md_out`` and print it."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--run", help="the finished run folder to measure")
    parser.add_argument("--workspace", default=os.environ.get("LOLCATS_WORKSPACE", "workspace"))
    parser.add_argument("--render", action="store_true", help="rewrite the Markdown table from the JSON")
    args = parser.parse_args(argv)
    if args.run:
        json_out.write_text(json.dumps(measure(args.run, args.workspace), indent=1) + "\n")
    elif not args.render:
        parser.error("nothing to do: give --run or --render")
    md_out.write_text(render(json.loads(json_out.read_text())))
    print(md_out.read_text())
    return 0
