"""Multi-process stages (torchrun, gloo on CPU, 2 processes) against the single-process run.

Stage 1 block-wise: each process trains its own blocks; the gathered ``stage1/best`` equals the
single-process block-wise run's, tensor for tensor. Stage 2 data-parallel, with the model
replicated (DDP) or sharded (FSDP): 2 processes each take half of every accumulation group; the
adapters (and, for FSDP, the optimizer state) equal the single-process run with the same global
batch within float tolerance, and a sharded run resumes a single-process checkpoint."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from core.train.checkpoint import load_checkpoint
from core.config import ConfigError, load_config
from core.pipeline.distributed import RankProgress, run_stage1, run_stage2, stage2_strategy
from core.progress import StopRequested
from core.models import tiny_model_dir
from tests.deploy.helpers import PROJECT_ROOT

CONFIG = {  # the tiny-test preset, on CPU, one layer per block, two micro-batches per step
    "model": {"device": "cpu"},
    "stage1": {"layers_per_block": 1},
    "stage2": {"grad_accum": 2},
}


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    ws = tmp_path_factory.mktemp("ws")
    tiny_model_dir(ws)  # materialise the model once; the launched processes only read it
    return ws


@pytest.fixture(scope="module")
def config_file(workspace) -> Path:
    path = workspace / "tiny.yaml"
    path.write_text(yaml.safe_dump(CONFIG))
    return path


def config(config_file):
    return load_config(config_file, "tiny-test")


def torchrun(stage: str, config_file: Path, output: str, workspace: Path, nproc: int = 2,
             extra: tuple[str, ...] = ()) -> tuple[dict, str]:
    """``torchrun --nproc_per_node nproc -m core.cli.distributed STAGE``; returns rank 0's result and the output."""
    result = workspace / f"{output}-{stage}.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(PROJECT_ROOT), os.environ.get("PYTHONPATH")) if p),
           "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
           "-m", "core.cli.distributed", stage, "--config", str(config_file), "--preset", "tiny-test",
           "--output", output, "--workspace", str(workspace), "--result", str(result), *extra]
    proc = subprocess.run(cmd, env=env, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=300)
    output_text = proc.stdout + proc.stderr
    assert proc.returncode == 0, output_text[-6000:]
    return json.loads(result.read_text()), output_text


@pytest.fixture(scope="module")
def stage1_runs(workspace, config_file):
    single = workspace / "runs" / "single"
    run_stage1(config(config_file), single, workspace)  # no launcher: one process, all blocks
    result, output = torchrun("stage1", config_file, "multi", workspace)
    return single, workspace / "runs" / "multi", result, output


def assert_same_tensors(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], rtol: float, atol: float) -> None:
    assert a and set(a) == set(b)
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=rtol, atol=atol, msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.slow
def test_stage1_blockwise_across_processes_equals_one_process(stage1_runs):
    single, multi, result, output = stage1_runs
    assert result["ranks"] == {"0": [0], "1": [1]}  # one block per process
    assert sorted(result["blocks"]) == ["block0", "block1"]
    assert "[rank 0] stage1/block0" in output and "[rank 1] stage1/block1" in output
    ref, ref_state = load_checkpoint(single / "stage1" / "best")
    got, state = load_checkpoint(multi / "stage1" / "best")
    assert {n.split(".layers.")[1].split(".")[0] for n in got} == {"0", "1"}  # per-layer tensors of both layers
    assert_same_tensors(got, ref, rtol=1e-6, atol=1e-8)
    assert state["step"] == ref_state["step"] == 4 and state["blocks"] == ref_state["blocks"] == 2
    for block in ("block0", "block1"):  # each block's own best checkpoint agrees too
        assert_same_tensors(load_checkpoint(multi / "stage1" / block / "best")[0],
                            load_checkpoint(single / "stage1" / block / "best")[0], rtol=1e-6, atol=1e-8)
    # each process cached only its own block's teacher inputs, into the shared run folder
    assert sorted(p.name for p in (multi / "stage1" / "cache" / "train").iterdir()) == [
        "layer0.safetensors", "layer1.safetensors"]


def after_stage1(stage1_runs, workspace: Path, name: str) -> Path:
    """A run folder holding a copy of the single-process run's finished stage 1."""
    run = workspace / "runs" / name
    run.mkdir(parents=True)
    shutil.copy(stage1_runs[0] / "config.json", run / "config.json")
    shutil.copytree(stage1_runs[0] / "stage1", run / "stage1")
    return run


@pytest.fixture(scope="module")
def stage2_single(stage1_runs, workspace, config_file) -> tuple[Path, dict]:
    """The single-process stage 2 every multi-process run is compared with."""
    run = after_stage1(stage1_runs, workspace, "s2-single")
    return run, run_stage2(config(config_file), run, workspace)


def optimizer_tensors(state: dict) -> dict[str, torch.Tensor]:
    return {f"{i}.{k}": v for i, s in state["optimizer"]["state"].items() for k, v in s.items()}


def assert_same_stage2(got_run: Path, ref_run: Path, optimizer: bool = False) -> None:
    for which in ("last", "best"):
        ref, ref_state = load_checkpoint(ref_run / "stage2" / which)
        got, state = load_checkpoint(got_run / "stage2" / which)
        assert all("lora_" in n for n in got)
        assert_same_tensors(got, ref, rtol=1e-4, atol=1e-6)
        assert state["step"] == ref_state["step"]
        if optimizer and which == "last":  # Adam moments gathered whole, in the single-process layout
            assert_same_tensors(optimizer_tensors(state), optimizer_tensors(ref_state), rtol=1e-4, atol=1e-7)
    # the adapters did move: the comparison is not between two untouched initialisations
    init_b = [t for n, t in got.items() if "lora_B" in n]
    assert init_b and any(t.abs().max() > 0 for t in init_b)


@pytest.mark.slow
def test_stage2_data_parallel_equals_one_process_with_the_same_global_batch(stage1_runs, stage2_single, workspace,
                                                                            config_file):
    after_stage1(stage1_runs, workspace, "s2-ddp")
    result, output = torchrun("stage2", config_file, "s2-ddp", workspace)
    assert "data-parallel (DDP) over 2 processes" in output and "1 micro-batches per process" in output
    assert result["best_val_loss"] == pytest.approx(stage2_single[1]["best_val_loss"], rel=1e-5)
    assert_same_stage2(workspace / "runs" / "s2-ddp", stage2_single[0])


def held_elements(output: str, rank: int) -> tuple[int, int]:
    """Parse ``[rank R] stage2: sharded ... holds H of T parameter elements``. The two processes share one
    stderr, so the line may follow another process's unterminated progress bar: search, don't anchor."""
    found = re.search(rf"\[rank {rank}\] stage2: sharded.*?holds ([\d,]+) of ([\d,]+) parameter", output)
    assert found, f"no stage 2 sharding line from rank {rank} in:\n{output[-4000:]}"
    held, total = found.groups()
    return int(held.replace(",", "")), int(total.replace(",", ""))


@pytest.mark.slow
def test_stage2_sharded_equals_one_process_and_holds_half_the_weights(stage1_runs, stage2_single, workspace,
                                                                      config_file):
    after_stage1(stage1_runs, workspace, "s2-fsdp")
    result, output = torchrun("stage2", config_file, "s2-fsdp", workspace, extra=("--strategy", "fsdp"))
    assert "sharded (FSDP) over 2 processes on cpu" in output
    for rank in (0, 1):  # every weight is split between the two processes
        held, total = held_elements(output, rank)
        assert total > 100_000 and 0.45 * total <= held <= 0.55 * total
    assert result["best_val_loss"] == pytest.approx(stage2_single[1]["best_val_loss"], rel=1e-5)
    assert_same_stage2(workspace / "runs" / "s2-fsdp", stage2_single[0], optimizer=True)


class StopAfter(RankProgress):
    """Asks the loop to stop once ``steps`` training steps are done."""

    def __init__(self, steps: int):
        super().__init__(0)
        self.steps, self.done = steps, 0

    def on_step(self, stage, step, total, metrics, layer_metrics=None) -> None:
        self.done = step

    def should_stop(self) -> bool:
        return self.done >= self.steps


@pytest.mark.slow
def test_sharded_stage2_resumes_a_single_process_checkpoint(stage1_runs, stage2_single, workspace, config_file):
    run = after_stage1(stage1_runs, workspace, "s2-resume")
    with pytest.raises(StopRequested):
        run_stage2(config(config_file), run, workspace, progress=StopAfter(2))
    assert load_checkpoint(run / "stage2" / "last")[1]["step"] == 2
    result, output = torchrun("stage2", config_file, "s2-resume", workspace, extra=("--strategy", "fsdp"))
    assert "resuming after step 2" in output
    assert result["resumed_from"] == 2
    assert_same_stage2(run, stage2_single[0], optimizer=True)  # as if it had never stopped


def test_user_errors_name_the_fix(workspace, config_file, monkeypatch, tmp_path):
    joint = load_config(None, "tiny-test")
    with pytest.raises(ConfigError, match="set stage1.layers_per_block"):
        run_stage1(joint, tmp_path / "run", workspace)
    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(ConfigError, match=r"grad_accum \(2\) must be a multiple of the number of processes \(3\)"):
        run_stage2(config(config_file), tmp_path / "run", workspace)
    monkeypatch.delenv("WORLD_SIZE")
    with pytest.raises(ConfigError, match="stage 1 is not finished"):
        run_stage2(config(config_file), tmp_path / "fresh", workspace)


def test_stage2_strategy_follows_the_flag_and_accelerate(workspace, config_file):
    from accelerate.utils import DistributedType

    assert stage2_strategy(None, DistributedType.MULTI_CPU) == "ddp"
    assert stage2_strategy("fsdp", DistributedType.MULTI_GPU) == "fsdp"
    assert stage2_strategy(None, DistributedType.FSDP) == "fsdp"
    with pytest.raises(ConfigError, match="configured for FSDP but --strategy ddp"):
        stage2_strategy("ddp", DistributedType.FSDP)
    with pytest.raises(ConfigError, match="DEEPSPEED.*--strategy fsdp"):
        stage2_strategy(None, DistributedType.DEEPSPEED)


def test_strategy_flag_is_refused_for_stage1(config_file, capsys):
    from core.cli.distributed import main

    assert main(["stage1", "--config", str(config_file), "--preset", "tiny-test", "-o", "x", "--strategy", "fsdp"]) == 1
    assert "--strategy is for stage 2" in capsys.readouterr().err
