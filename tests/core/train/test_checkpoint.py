"""Checkpoint writes are atomic: a failure mid-write leaves the previous checkpoint valid."""

import errno

import pytest
import torch

import core.train.checkpoint as ck


def test_disk_full_mid_write_keeps_previous_checkpoint(tmp_path, monkeypatch):
    target = tmp_path / "stage1" / "last"
    good = {"w": torch.arange(6.0).view(2, 3)}
    ck.save_checkpoint(target, good, {"step": 3})
    real_save = ck.save_file

    def disk_full(tensors, filename):
        real_save(tensors, filename)
        with open(filename, "r+b") as f:  # leave a truncated file behind, as a full disk would
            f.truncate(10)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ck, "save_file", disk_full)
    with pytest.raises(OSError, match="No space left"):
        ck.save_checkpoint(target, {"w": torch.zeros(2, 3)}, {"step": 4})
    tensors, state = ck.load_checkpoint(target)
    assert state["step"] == 3 and torch.equal(tensors["w"], good["w"])
    assert sorted(p.name for p in target.parent.iterdir()) == ["last"]  # no temporary folders left


def test_a_kill_between_the_renames_loses_no_checkpoint(tmp_path, monkeypatch):
    """SIGKILL after the old checkpoint is moved aside and before the new one takes its place (no
    cleanup runs): a resume finds the old one back and no half-written folder left."""
    target = tmp_path / "stage2" / "last"
    good = {"w": torch.arange(6.0).view(2, 3)}
    ck.save_checkpoint(target, good, {"step": 3})
    real_replace, calls = ck.os.replace, []

    def killed_on_second_rename(src, dst):
        calls.append(dst)
        if len(calls) == 2:
            raise KeyboardInterrupt  # stands for the kill: nothing after this line runs
        real_replace(src, dst)

    monkeypatch.setattr(ck.os, "replace", killed_on_second_rename)
    monkeypatch.setattr(ck.shutil, "rmtree", lambda *a, **k: None)  # a killed process cleans nothing up
    with pytest.raises(KeyboardInterrupt):
        ck.save_checkpoint(target, {"w": torch.zeros(2, 3)}, {"step": 4})
    monkeypatch.undo()
    assert not target.exists() and len(list(target.parent.iterdir())) == 2  # the old one aside, the new one unplaced
    assert ck.has_checkpoint(target)
    tensors, state = ck.load_checkpoint(target)
    assert state["step"] == 3 and torch.equal(tensors["w"], good["w"])
    assert sorted(p.name for p in target.parent.iterdir()) == ["last"]
    assert not ck.has_checkpoint(tmp_path / "stage1" / "last")


def test_optimizer_state_round_trip(tmp_path):
    p = torch.nn.Parameter(torch.randn(4))
    opt = torch.optim.AdamW([p], lr=0.1)
    p.grad = torch.randn(4)
    opt.step()
    ck.save_checkpoint(tmp_path / "c", {"p": p.detach()}, {"step": 1, "best": float("inf")}, ck.optimizer_state(opt))
    _, state = ck.load_checkpoint(tmp_path / "c")
    opt2 = torch.optim.AdamW([torch.nn.Parameter(p.detach().clone())], lr=0.1)
    ck.load_optimizer_state(opt2, state["optimizer"])
    first = lambda o: o.state[o.param_groups[0]["params"][0]]  # noqa: E731
    assert torch.equal(first(opt2)["exp_avg"], first(opt)["exp_avg"]) and first(opt2)["step"] == 1
    assert state["best"] == float("inf")


def test_a_checkpoint_written_without_parents_never_recreates_the_folders_above_its_own(tmp_path):
    gone = tmp_path / "run"  # a run folder deleted while a conversion runs
    with pytest.raises(FileNotFoundError):
        ck.save_checkpoint(gone / "stage1" / "last", {"w": torch.ones(2)}, {"step": 1}, parents=False)
    assert not gone.exists()
    (gone / "stage1").mkdir(parents=True)
    ck.save_checkpoint(gone / "stage1" / "last", {"w": torch.ones(2)}, {"step": 1}, parents=False)
    assert ck.load_checkpoint(gone / "stage1" / "last")[1]["step"] == 1
