"""Backend selection: LOLCATS_KERNELS=auto|triton|torch, set_backend, and the messages when the
Triton path is forced where it cannot run."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from core.attention import hybrid_attention
from kernels import dispatch
from kernels.hybrid.naive import positions
from kernels.hybrid.window import WindowRule
from tests.attention_inputs import make_inputs
from tests.kernels.conftest import DEVICE
from tests.kernels.utils import assert_close

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _clean_backend(monkeypatch):
    monkeypatch.delenv(dispatch.ENV_VAR, raising=False)
    dispatch.set_backend(None)
    yield
    dispatch.set_backend(None)


def spy_on_backends(monkeypatch):
    """Record which implementation core.attention.hybrid_attention reaches."""
    calls = []
    chunk_triton, _ = dispatch.load_triton()
    real_torch, real_triton = dispatch.hybrid_attention_torch, chunk_triton.hybrid_attention_triton

    def torch_spy(*args, **kwargs):
        calls.append("torch")
        return real_torch(*args, **kwargs)

    def triton_spy(*args, **kwargs):
        calls.append("triton")
        return real_triton(*args, **kwargs)

    monkeypatch.setattr(dispatch, "hybrid_attention_torch", torch_spy)
    monkeypatch.setattr(chunk_triton, "hybrid_attention_triton", triton_spy)
    return calls


@pytest.mark.parametrize("decayed", [False, True], ids=["paper", "decay"])
def test_env_switch_selects_the_backend(monkeypatch, decayed):
    calls = spy_on_backends(monkeypatch)
    q, k, v, qf, kf, mix, mask = make_inputs(2, 2, 1, 30, 16, 8, pads=(0, 4), device=DEVICE)
    decay = torch.tensor([0.7, 0.9], device=DEVICE).log() if decayed else None
    monkeypatch.setenv(dispatch.ENV_VAR, "torch")
    y_torch = hybrid_attention(q, k, v, qf, kf, mix, WindowRule("terraced", 8), mask, decay=decay)
    monkeypatch.setenv(dispatch.ENV_VAR, "triton")
    y_triton = hybrid_attention(q, k, v, qf, kf, mix, WindowRule("terraced", 8), mask, decay=decay)
    monkeypatch.setenv(dispatch.ENV_VAR, "auto")
    hybrid_attention(q, k, v, qf, kf, mix, WindowRule("terraced", 8), mask, decay=decay)
    assert calls == ["torch", "triton", "triton" if DEVICE == "cuda" else "torch"]
    m = mask.bool()[:, None, :, None]
    assert_close("triton vs torch", torch.where(m, y_torch, 0), torch.where(m, y_triton, 0), 1e-5)


@torch.no_grad()
def test_decode_step_follows_the_same_switch(monkeypatch):
    """dispatch.decode_step reaches the Triton or the PyTorch decode step by the same rule."""
    from kernels.hybrid import recurrent_torch
    from tests.kernels.hybrid.decoding import decode_case

    _, recurrent_triton = dispatch.load_triton()
    calls = []

    def spy(module, name):
        real = getattr(module, name)

        def recorded(*args, **kwargs):
            calls.append(name)
            return real(*args, **kwargs)

        monkeypatch.setattr(module, name, recorded)

    spy(recurrent_torch, "decode_step_torch")
    spy(recurrent_triton, "decode_step_triton")
    case = decode_case("terraced", 4, T=1)
    ys = []
    for backend in ("torch", "triton", "auto"):
        monkeypatch.setenv(dispatch.ENV_VAR, backend)
        state = dispatch.prefill_state(case.rule, case.k, case.v, case.key_features(case.k, positions(case.mask)), case.mask)
        y, state = dispatch.decode_step(state, *case.step_args(0))
        assert state.seen == case.k.shape[2] + 1
        ys.append(y)
    auto = "decode_step_triton" if DEVICE == "cuda" else "decode_step_torch"
    assert calls == ["decode_step_torch", "decode_step_triton", auto]
    assert_close("triton vs torch", ys[0], ys[1], 1e-5)


def test_auto_uses_pytorch_on_cpu_even_with_the_interpreter(monkeypatch):
    monkeypatch.setenv(dispatch.ENV_VAR, "auto")
    assert dispatch.select_backend("cpu") == "torch"
    monkeypatch.delenv(dispatch.ENV_VAR)
    assert dispatch.select_backend("cpu") == "torch"


def test_precedence_and_bad_values(monkeypatch):
    monkeypatch.setenv(dispatch.ENV_VAR, "triton")
    dispatch.set_backend("torch")
    assert dispatch.select_backend(DEVICE) == "torch"
    assert dispatch.select_backend(DEVICE, backend="triton") == "triton"
    monkeypatch.setenv(dispatch.ENV_VAR, "cuda")
    dispatch.set_backend(None)
    with pytest.raises(ValueError, match=r"LOLCATS_KERNELS must be one of auto, triton, torch; got 'cuda'"):
        dispatch.select_backend(DEVICE)
    with pytest.raises(ValueError, match="kernel backend must be one of"):
        dispatch.set_backend("fast")


@pytest.mark.skipif(DEVICE == "cuda", reason="checks the CPU-only messages")
def test_forcing_triton_where_it_cannot_run_says_why():
    """Fresh processes: no interpreter (CPU tensors), and Triton not importable at all."""
    script = r"""
import json, os, sys
os.environ.pop("TRITON_INTERPRET", None)
os.environ["LOLCATS_KERNELS"] = "triton"
if sys.argv[1] == "no-triton":
    sys.modules["triton"] = None  # what a missing install looks like to an import
import torch
from core.attention import WindowRule, hybrid_attention
x = torch.rand(1, 1, 4, 16)
try:
    hybrid_attention(x, x, x, x, x, torch.zeros(1), WindowRule("terraced", 2))
    print(json.dumps({"error": None}))
except Exception as exc:
    print(json.dumps({"type": type(exc).__name__, "error": str(exc)}))
"""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    results = {}
    for case in ("no-interpreter", "no-triton"):
        out = subprocess.run(
            [sys.executable, "-c", script, case], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
        )
        assert out.returncode == 0, out.stderr[-2000:]
        results[case] = json.loads(out.stdout.strip().splitlines()[-1])
    msg = results["no-interpreter"]
    assert msg["type"] == "KernelBackendError"
    assert "tensors are on cpu" in msg["error"] and "need a CUDA device" in msg["error"]
    assert "TRITON_INTERPRET=1" in msg["error"] and "LOLCATS_KERNELS=torch" in msg["error"]
    msg = results["no-triton"]
    assert msg["type"] == "KernelBackendError"
    assert "the `triton` package failed to import" in msg["error"] and "pip install triton" in msg["error"]
    assert "LOLCATS_KERNELS=torch" in msg["error"]


def test_pytorch_form_needs_no_triton_import():
    """Importing core and running on the PyTorch form never imports the Triton kernel modules."""
    script = (
        "import os, sys; os.environ['LOLCATS_KERNELS'] = 'torch'; import torch; "
        "from core.attention import WindowRule, hybrid_attention; x = torch.rand(1, 1, 4, 8); "
        "hybrid_attention(x, x, x, x, x, torch.zeros(1), WindowRule('terraced', 2)); "
        "print('kernels.hybrid.chunk_triton' in sys.modules, 'kernels._triton' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["False", "False"]


def test_smoke_test_runs_forward_and_backward(monkeypatch):
    """The one-off check auto mode runs on a CUDA device (here on the interpreter's CPU tensors)."""
    monkeypatch.setattr(dispatch, "_smoke", {})
    cpu = torch.device(DEVICE)
    assert dispatch._smoke_test(cpu, ("terraced", 16, 8, torch.float32, torch.float32, True, True)) is None
    assert dispatch._smoke_test(cpu, ("sliding_window", 16, 8, torch.bfloat16, torch.float32, False, False)) is None
    chunk_triton, _ = dispatch.load_triton()

    def broken(*args, **kwargs):
        raise RuntimeError("ptxas fatal: unsupported target")

    monkeypatch.setattr(chunk_triton, "hybrid_attention_triton", broken)
    problem = dispatch._smoke_test(cpu, ("linear", 16, 8, torch.float32, torch.float32, True, False))
    assert "compiling or running the kernels failed" in problem and "ptxas fatal" in problem


def test_auto_on_cuda_falls_back_with_one_warning_when_the_kernels_fail(monkeypatch):
    monkeypatch.setattr(dispatch, "_triton_problem", lambda device: None)
    monkeypatch.setattr(dispatch, "_warned", set())
    monkeypatch.setattr(dispatch, "_smoke_test", lambda device, signature: None)
    assert dispatch.select_backend("cuda") == "triton"
    monkeypatch.setattr(dispatch, "_smoke_test", lambda device, signature: "compiling or running the kernels failed: X")
    with pytest.warns(UserWarning, match="Triton kernels unavailable on cuda .*compiling or running the kernels failed"):
        assert dispatch.select_backend("cuda") == "torch"
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert dispatch.select_backend("cuda") == "torch"  # warned once per device and signature
    with pytest.raises(dispatch.KernelBackendError, match="LOLCATS_KERNELS=triton was requested but compiling"):
        dispatch.select_backend("cuda", backend="triton")


def test_sink_tokens_reach_the_triton_kernels(monkeypatch):
    """A call with sink tokens follows the same switch as one without: ``triton`` runs the chunk
    kernels (equal to the PyTorch form), ``auto`` on CPU the PyTorch form."""
    calls = spy_on_backends(monkeypatch)
    q, k, v, qf, kf, mix, mask = make_inputs(2, 2, 1, 30, 16, 8, pads=(0, 4), device=DEVICE)
    rule = WindowRule("terraced", 8, 2)
    monkeypatch.setenv(dispatch.ENV_VAR, "triton")
    y_triton = hybrid_attention(q, k, v, qf, kf, mix, rule, mask)
    monkeypatch.setenv(dispatch.ENV_VAR, "torch")
    y_torch = hybrid_attention(q, k, v, qf, kf, mix, rule, mask)
    monkeypatch.setenv(dispatch.ENV_VAR, "auto")
    hybrid_attention(q, k, v, qf, kf, mix, rule, mask)
    assert calls == ["triton", "torch", "triton" if DEVICE == "cuda" else "torch"]
    m = mask.bool()[:, None, :, None]
    assert_close("triton vs torch", torch.where(m, y_torch, 0), torch.where(m, y_triton, 0), 1e-5)


def test_auto_on_cuda_picks_triton_for_the_recipe_attention(monkeypatch):
    """A tiny model converted with paper-8b's attention (terraced, w 64, 4 sink tokens, a decaying
    history, feature maps before RoPE) asks for the backend with a signature whose smoke test the
    kernels pass (here through the interpreter), so ``auto`` picks Triton for it on CUDA."""
    import core
    from core.config import preset
    from tests.tiny_models import tiny_model

    spec = preset("paper-8b").attention
    recipe = (spec.kind, spec.window_size, spec.sink_tokens, spec.history_norm, spec.feature_positions)
    assert recipe == ("terraced", 64, 4, "decay", "none")
    signatures = []
    real_select, real_smoke = dispatch.select_backend, dispatch._smoke_test
    monkeypatch.setattr(dispatch, "select_backend", lambda device, backend=None, signature=None:
                        signatures.append(signature) or real_select(device, backend, signature))
    model = core.linearize(tiny_model("llama", seed=0), spec)
    with torch.no_grad():
        model(input_ids=torch.randint(3, 101, (1, 70)), use_cache=False)
    assert len(set(signatures)) == 1 and signatures[0][-2:] == (True, True)  # decayed, with sinks
    monkeypatch.setattr(dispatch, "_triton_problem", lambda device: None)
    monkeypatch.setattr(dispatch, "_smoke", {})
    smoked = []
    monkeypatch.setattr(dispatch, "_smoke_test", lambda device, signature: smoked.append(signature) or
                        real_smoke(torch.device(DEVICE), signature))
    assert real_select("cuda", "auto", signatures[0]) == "triton"
    assert smoked == signatures[:1] and dispatch._smoke[(DEVICE,) + signatures[0]] is None


def _broken(name, change):
    """``change`` applied to the input ``name`` of a small valid call (q [1, 4, 8, 16], k and v
    [1, 2, 8, 16], features [1, 4, 8, 8], mix [4], mask [1, 8], decay [4])."""
    q, k, v, qf, kf, mix, mask = make_inputs(1, 4, 2, 8, 16, 4)
    inputs = dict(q=q, k=k, v=v, q_feat=qf, k_feat=kf, mix=mix, attention_mask=mask, decay=torch.zeros(4))
    inputs[name] = change(inputs[name])
    return inputs


@pytest.mark.parametrize(
    "name, change, message",
    [
        ("q", lambda t: t[0], r"q, k, v must be 4-D \[B, H, L, d\]; got \(4, 8, 16\), \(1, 2, 8, 16\), \(1, 2, 8, 16\)"),
        ("v", lambda t: t[:, :, :5], r"k and v must be \[B, H_kv, L, d\] = \[1, H_kv, 8, 16\]; got .*\(1, 2, 5, 16\)"),
        ("k", lambda t: t[..., :8], r"k and v must be \[B, H_kv, L, d\] = \[1, H_kv, 8, 16\]; got \(1, 2, 8, 8\)"),
        ("q_feat", lambda t: t[:, :3], r"q_feat must be \[B, H, L, F\] and k_feat \[B, H, L, F\] or \[B, H_kv, L, F\] "
                                       r"with B, H, H_kv, L = 1, 4, 2, 8; got \(1, 3, "),
        ("k_feat", lambda t: t[..., :4], r"q_feat must be .*got \(1, 4, 8, 8\), \(1, 4, 8, 4\)"),
        ("k_feat", lambda t: t[:, :3], r"q_feat must be .*got \(1, 4, 8, 8\), \(1, 3, 8, 8\)"),
        ("mix", lambda t: t[:2], r"mix must have shape \[H\] = \[4\]; got \(2,\)"),
        ("attention_mask", lambda t: t[:, :7], r"attention_mask must be \[B, L\] = \[1, 8\]; got \(1, 7\)"),
        ("decay", lambda t: t[:3], r"decay must have one rate per head of k_feat, \[4\]; got \(3,\)"),
    ],
    ids=["q-3d", "v-length", "k-head-dim", "q_feat-heads", "k_feat-features", "k_feat-heads", "mix", "mask", "decay"],
)
def test_the_kernels_op_refuses_bad_shapes(name, change, message):
    """A caller of kernels.dispatch gets the contract's checks (before any backend is chosen)."""
    with pytest.raises(ValueError, match=message):
        dispatch.hybrid_attention(rule=WindowRule("terraced", 4), **_broken(name, change))


def test_the_kernels_op_wants_a_decay_rate_per_key_value_head_with_key_features_per_key_value_head():
    q, k, v, qf, kf, mix, _ = make_inputs(1, 4, 2, 8, 16, 4)
    with pytest.raises(ValueError, match=r"decay must have one rate per head of k_feat, \[2\]; got \(4,\)"):
        dispatch.hybrid_attention(q, k, v, qf, kf[:, :2], mix, WindowRule("terraced", 4), decay=torch.zeros(4))


def test_the_kernels_op_refuses_grouped_heads_that_do_not_divide():
    q, k, v, qf, kf, mix, _ = make_inputs(1, 4, 2, 8, 16, 4)
    with pytest.raises(ValueError, match=r"query heads \(3\) must be a multiple of key/value heads \(2\)"):
        dispatch.hybrid_attention(q[:, :3], k, v, qf[:, :3], kf[:, :3], mix[:3], WindowRule("terraced", 4))


@pytest.mark.parametrize(
    "args, message",
    [
        (("softmax", 4), "unknown attention kind 'softmax'"),
        (("linear", 4, 2), "sink tokens need a softmax part"),
        (("terraced", 4, -1), "sink tokens must be an integer >= 0, got -1"),
        (("sliding_window", 0), "window_size must be >= 1, got 0"),
    ],
    ids=["kind", "sinks-linear", "sinks-negative", "window"],
)
def test_the_kernels_op_refuses_a_bad_window_rule(args, message):
    """Kind, window and sinks are the rule's: refused when it is made, for every caller of the op."""
    q, k, v, qf, kf, mix, _ = make_inputs(1, 4, 2, 8, 16, 4)
    with pytest.raises(ValueError, match=message):
        dispatch.hybrid_attention(q, k, v, qf, kf, mix, WindowRule(*args))


def test_the_kernels_op_wants_a_window_rule():
    q, k, v, qf, kf, mix, _ = make_inputs(1, 4, 2, 8, 16, 4)
    with pytest.raises(TypeError, match=r"rule must be a kernels.hybrid.window.WindowRule\(kind, .*\); got 'terraced'"):
        dispatch.hybrid_attention(q, k, v, qf, kf, mix, "terraced", 4)


def test_core_entry_is_the_kernels_op():
    import core
    import core.attention.functional as functional

    assert hybrid_attention is functional.hybrid_attention is core.hybrid_attention is dispatch.hybrid_attention
    assert functional.WindowRule is core.WindowRule is WindowRule
