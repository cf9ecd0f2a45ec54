"""The model stays a model: stage 1 records its pairs outside the layers, and teacher mode is per thread."""

import threading

import pytest
import torch

import core
from core.config import Stage1Spec
from core.progress import RecordingProgress
from core.train.distill_attention import layer_losses, train_stage1
from core.train.teacher_forcing import teacher_forcing
from tests.core.train.test_stages import blocks, student

TORCH_INTERNALS = {"_parameters", "_buffers", "_modules", "_non_persistent_buffers_set"}


def _tensors(value, depth=0):
    """Tensors held by ``value``: itself, in containers, or one object level down (e.g. PaddingMask)."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (tuple, list, set)):
        for v in value:
            yield from _tensors(v, depth)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v, depth)
    elif depth == 0 and hasattr(value, "__dict__") and not isinstance(value, (torch.nn.Module, type)):
        yield from _tensors(vars(value), depth + 1)


def stray_tensors(model: torch.nn.Module) -> list[str]:
    """Attributes of ``model``'s modules holding a tensor that is none of its parameters or buffers."""
    owned = {id(t) for t in (*model.parameters(), *model.buffers())}
    found = []
    for name, module in model.named_modules():
        for attr, value in vars(module).items():
            if attr in TORCH_INTERNALS or attr.startswith("_forward") or attr.startswith("_backward"):
                continue
            if any(id(t) not in owned for t in _tensors(value)):
                found.append(f"{name}.{attr}")
    return found


def hooks(module: torch.nn.Module) -> int:
    return len(module._forward_hooks) + len(module._forward_pre_hooks)


@pytest.mark.parametrize("xent", [False, True], ids=["mse", "mse+xent"])
def test_a_stage1_step_leaves_no_batch_tensors_on_the_model(xent):
    model = student()
    converted = core.lolcats_modules(model)
    assert stray_tensors(model) == []
    before = {i: hooks(m) for i, m in converted.items()}
    losses = layer_losses(model, blocks(2), xent=xent)
    loss = torch.stack([v["mse"] for v in losses.values()]).sum()
    loss.backward()
    assert set(losses) == set(converted) and all(p.grad is not None for m in converted.values()
                                                 for p in m.trained_parameters())
    assert stray_tensors(model) == []
    assert {i: hooks(m) for i, m in converted.items()} == before
    assert all("forward" not in vars(m) for m in converted.values())


@pytest.mark.slow  # a whole stage 1 on the tiny model; the step above covers the fast tier
def test_stage1_training_leaves_no_batch_tensors_on_the_model(tmp_path):
    model = student()
    spec = Stage1Spec(steps=2, lr=1e-2, eval_every=1, eval_blocks=1, xent_factor=0.1)
    train_stage1(model, spec, blocks(4), blocks(2, seed=1), tmp_path, RecordingProgress(), seed=0, config={})
    assert stray_tensors(model) == []
    assert all(m.mode == "student" and "forward" not in vars(m) for m in core.lolcats_modules(model).values())


def test_teacher_forcing_detaches_after_an_exception():
    model = student()
    converted = core.lolcats_modules(model)
    ids = blocks(1)["input_ids"]
    with torch.no_grad():
        expected = model(input_ids=ids).logits
    with pytest.raises(RuntimeError, match="inside"), torch.no_grad(), teacher_forcing(converted, keep_qk=True) as record:
        model(input_ids=ids)
        assert set(record.pairs) == set(record.qk) == set(converted)
        raise RuntimeError("inside")
    assert all("forward" not in vars(m) for m in converted.values())
    assert stray_tensors(model) == []
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).logits, expected, rtol=0, atol=0)  # the student again


def test_teacher_forcing_passes_the_teacher_on():
    """Every layer's recorded teacher output is the softmax layer's on the teacher's hidden states,
    so the decoder's output under teacher forcing is the teacher's."""
    model = student()
    ids = blocks(1)["input_ids"]
    converted = core.lolcats_modules(model)
    with torch.no_grad():
        with core.teacher_attention(converted.values()):
            teacher = model.get_decoder()(input_ids=ids).last_hidden_state
        with teacher_forcing(converted) as record:
            forced = model.get_decoder()(input_ids=ids).last_hidden_state
    torch.testing.assert_close(forced, teacher, rtol=0, atol=0)
    assert all(not s.equal(t) for s, t in record.pairs.values())


def test_teacher_mode_in_one_thread_leaves_another_a_student():
    model = student()
    converted = core.lolcats_modules(model)
    ids = blocks(1)["input_ids"]
    with torch.no_grad():
        want_student = model(input_ids=ids).logits
        with core.teacher_attention(converted.values()):
            want_teacher = model(input_ids=ids).logits
    entered, done = threading.Event(), threading.Event()
    seen = {}

    def teacher_thread():
        with torch.no_grad(), core.teacher_attention(converted.values()):
            entered.set()
            done.wait(timeout=30)
            seen["modes"] = {m.mode for m in converted.values()}
            seen["logits"] = model(input_ids=ids).logits

    thread = threading.Thread(target=teacher_thread)
    thread.start()
    try:
        assert entered.wait(timeout=30)
        assert {m.mode for m in converted.values()} == {"student"}
        with torch.no_grad():
            torch.testing.assert_close(model(input_ids=ids).logits, want_student, rtol=0, atol=0)
    finally:
        done.set()
        thread.join(timeout=30)
    assert seen["modes"] == {"teacher"}
    torch.testing.assert_close(seen["logits"], want_teacher, rtol=0, atol=0)


def test_the_mode_is_not_shared_state_to_set():
    model = student()
    with pytest.raises(AttributeError):
        core.lolcats_modules(model)[0].mode = "teacher"
