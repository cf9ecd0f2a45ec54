"""``python -m core.cli.distributed STAGE``: one conversion stage across the processes of a
torchrun / accelerate launch (the stages themselves: :mod:`core.pipeline.distributed`)::

    python -m torch.distributed.run --standalone --nproc_per_node N -m core.cli.distributed stage1 --config my.yaml --output my-run
    accelerate launch --num_processes N -m core.cli.distributed stage2 --config my.yaml --output my-run
    lolcats convert my.yaml --output my-run --resume     # both stages found finished: evaluation, report.json

Exit status as for every command line (:mod:`core.cli.common`); ``--result`` makes rank 0 write
its stage's result as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from core.cli.common import PRESET_HELP, SET_HELP, WORKSPACE_HELP, exit_status, run_path
from core.config import ConfigError, load_config
from core.pipeline.distributed import STRATEGIES, run_stage1, run_stage2
from core.run_folder import STAGE1, STAGE_DIRS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m core.cli.distributed",
        description="Run one conversion stage across the processes of a torchrun / accelerate launch.")
    parser.add_argument("stage", choices=STAGE_DIRS)
    parser.add_argument("--config", type=Path, default=None, help="YAML run config (sections as for lolcats convert)")
    parser.add_argument("--preset", default=None, help=PRESET_HELP)
    parser.add_argument("--set", dest="sets", action="append", default=[], help=SET_HELP)
    parser.add_argument("--output", "-o", required=True,
                        help="run folder: an absolute path, or a name under <workspace>/runs")
    parser.add_argument("--workspace", "-w", default=None, help=WORKSPACE_HELP)
    parser.add_argument("--result", type=Path, default=None, help="rank 0 also writes its result here as JSON")
    parser.add_argument("--strategy", choices=STRATEGIES, default=None,
                        help="stage 2 only: ddp replicates the model on every process, fsdp shards it "
                             "(default: fsdp when accelerate is configured for FSDP, else ddp)")
    args = parser.parse_args(argv)
    try:
        if args.config is None and args.preset is None:
            raise ConfigError("give --config CONFIG.yaml or --preset NAME")
        config = load_config(args.config, args.preset, overrides=args.sets)
        output = run_path(args.output, args.workspace, "run")
        if args.stage == STAGE1:
            if args.strategy is not None:
                raise ConfigError("--strategy is for stage 2; stage 1 is block-wise: each process trains whole "
                                  "blocks of layers on its own")
            result = run_stage1(config, output, args.workspace)
        else:
            result = run_stage2(config, output, args.workspace, strategy=args.strategy)
    except Exception as exc:
        code = exit_status(exc)
        if code is None:
            raise
        return code
    if args.result is not None and int(os.environ.get("RANK", "0")) == 0:
        args.result.write_text(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
