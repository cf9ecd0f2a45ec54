"""Multi-process stages (torchrun, gloo on CPU, 2 processes) against the single-process run.

Stage 1 block-wise: each process trains its own blocks; the gathered ``stage1/best`` equals the
single-process block-wise run's, tensor for tensor. Stage 2 data-parallel: 2 processes each take
half of every accumulation group; the adapters equal the single-process run with the same global
batch within float tolerance."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from core.checkpoint import load_checkpoint
from core.config import ConfigError, load_config
from core.distributed import run_stage1, run_stage2
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


def torchrun(stage: str, config_file: Path, output: str, workspace: Path, nproc: int = 2) -> tuple[dict, str]:
    """``torchrun --nproc_per_node nproc -m core.distributed STAGE``; returns rank 0's result and the output."""
    result = workspace / f"{output}-{stage}.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(PROJECT_ROOT), os.environ.get("PYTHONPATH")) if p),
           "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
           "-m", "core.distributed", stage, "--config", str(config_file), "--preset", "tiny-test",
           "--output", output, "--workspace", str(workspace), "--result", str(result)]
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


@pytest.mark.slow
def test_stage2_data_parallel_equals_one_process_with_the_same_global_batch(stage1_runs, workspace, config_file):
    single_stage1 = stage1_runs[0]
    for name in ("s2-single", "s2-multi"):  # both continue the same finished stage 1
        run = workspace / "runs" / name
        run.mkdir(parents=True)
        shutil.copy(single_stage1 / "config.json", run / "config.json")
        shutil.copytree(single_stage1 / "stage1", run / "stage1")
    ref_result = run_stage2(config(config_file), workspace / "runs" / "s2-single", workspace)
    result, output = torchrun("stage2", config_file, "s2-multi", workspace)
    assert "data-parallel over 2 processes" in output and "1 micro-batches per process" in output
    assert result["best_val_loss"] == pytest.approx(ref_result["best_val_loss"], rel=1e-5)
    for which in ("last", "best"):
        ref, ref_state = load_checkpoint(workspace / "runs" / "s2-single" / "stage2" / which)
        got, state = load_checkpoint(workspace / "runs" / "s2-multi" / "stage2" / which)
        assert all("lora_" in n for n in got)
        assert_same_tensors(got, ref, rtol=1e-4, atol=1e-6)
        assert state["step"] == ref_state["step"]
    # the adapters did move: the comparison is not between two untouched initialisations
    init_b = [t for n, t in got.items() if "lora_B" in n]
    assert init_b and any(t.abs().max() > 0 for t in init_b)


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
