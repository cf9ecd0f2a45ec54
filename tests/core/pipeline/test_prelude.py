"""The run start shared by single-process and distributed runs, and the per-stage summaries."""

from __future__ import annotations

import pytest

from core.attention.surgery import is_linearized
from core.config import ConfigError, preset
from core.pipeline.prelude import save_stage_summary, stage_summary, start_run
from core.run_folder import RunFolderGoneError, check_intact


def test_start_run_leaves_the_run_folder_to_the_main_process(workspace, tmp_path):
    waits = []
    run = start_run(preset("tiny-test"), tmp_path / "run", resume=False, workspace=workspace, main=False,
                    barrier=lambda: waits.append("barrier"))
    assert waits == ["barrier", "barrier"]  # after the main process's folder, and after its load
    assert not (tmp_path / "run").exists()
    assert not is_linearized(run.model)  # the teacher: conversion is the caller's step
    assert run.train["input_ids"].shape[1] == 64 and run.val["input_ids"].shape[0] > 0 and run.data_info


def test_start_run_writes_the_config_once_and_checks_it_on_resume(workspace, tmp_path):
    out = tmp_path / "run"
    start_run(preset("tiny-test"), out, resume=False, workspace=workspace)
    assert (out / "config.json").is_file()
    with pytest.raises(ConfigError, match="already holds a run"):
        start_run(preset("tiny-test"), out, resume=False, workspace=workspace)
    with pytest.raises(ConfigError, match="stage1.lr"):
        start_run(preset("tiny-test", stage1={"lr": 0.5}), out, resume=True, workspace=workspace)


def test_a_run_folder_is_intact_while_it_holds_its_config(workspace, tmp_path):
    out = tmp_path / "run"
    start_run(preset("tiny-test"), out, resume=False, workspace=workspace)
    check_intact(out)
    (out / "config.json").unlink()
    with pytest.raises(RunFolderGoneError, match=f"the run folder {out} was deleted while the conversion ran"):
        check_intact(out)


def test_stage_summary_round_trip(tmp_path):
    assert stage_summary(tmp_path, "stage1") == {}  # a run from before summaries were kept
    summary = {"best_val_loss": 0.125, "steps": 4, "resumed_from": 2}
    save_stage_summary(tmp_path, "stage1", summary)
    assert stage_summary(tmp_path, "stage1") == summary


def test_a_run_whose_data_fails_to_load_leaves_no_run_folder(workspace, tmp_path):
    out = tmp_path / "run"
    with pytest.raises(ValueError, match="leaving none for training"):
        start_run(preset("tiny-test", data={"max_examples": 8, "val_examples": 8}), out, resume=False,
                  workspace=workspace)
    assert not out.exists()
    start_run(preset("tiny-test"), out, resume=False, workspace=workspace)  # no --resume needed
    assert (out / "config.json").is_file()
