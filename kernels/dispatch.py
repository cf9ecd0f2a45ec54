"""Hybrid attention, the public op: its contract (checked here) and the backend, Triton or PyTorch.

Entry points: :func:`hybrid_attention` (a whole sequence: checks its inputs, then ``chunk_triton``
or ``chunk_torch``; ``core.attention.hybrid_attention`` is this function), :func:`decode_step` (one
token against the recurrent state, ``recurrent_triton`` or ``recurrent_torch``), :func:`prefill_state`
(the state a prefill leaves behind, PyTorch) and :func:`prefill_chunk` (a chunk of a prompt from a
carried state, ``kernels.hybrid.carry``, PyTorch). Every one takes the window rule as a
:class:`kernels.hybrid.window.WindowRule`.
The backend, in order of precedence: the ``backend`` argument; :func:`set_backend`; the
``LOLCATS_KERNELS`` environment variable (``auto``, the default, ``triton`` or ``torch``).
``auto`` picks Triton for CUDA tensors when a one-off smoke test passes (else it warns once and
uses PyTorch) and PyTorch elsewhere; ``triton`` raises :class:`KernelBackendError` naming the cause
and the fix when the kernels cannot run; ``torch`` forces the PyTorch form (docs/kernels.md).

Importing this module never imports ``triton``.
"""

from __future__ import annotations

import os
import warnings

import torch

from kernels.hybrid import recurrent_torch
from kernels.hybrid.carry import prefill_chunk
from kernels.hybrid.chunk_torch import hybrid_attention_torch
from kernels.hybrid.heads import query_heads
from kernels.hybrid.recurrent_torch import HybridState, KeyFeatures, prefill_state
from kernels.hybrid.window import WindowRule

ENV_VAR = "LOLCATS_KERNELS"
BACKENDS = ("auto", "triton", "torch")

_override: str | None = None
_smoke: dict[tuple, str | None] = {}  # (device, kind, d, F, dtypes) -> None (works) or the failure
_warned: set[tuple] = set()


class KernelBackendError(RuntimeError):
    """The requested kernel backend cannot run here."""


def _check_name(name: str, source: str) -> str:
    value = name.strip().lower()
    if value not in BACKENDS:
        raise ValueError(f"{source} must be one of {', '.join(BACKENDS)}; got {name!r}")
    return value


def set_backend(name: str | None) -> None:
    """Process-wide backend (``auto``, ``triton``, ``torch``); ``None`` restores the environment's."""
    global _override
    _override = None if name is None else _check_name(name, "kernel backend")


def requested_backend(backend: str | None = None) -> str:
    """The requested backend name before resolution: argument, then set_backend, then environment."""
    if backend is not None:
        return _check_name(backend, "backend")
    if _override is not None:
        return _override
    return _check_name(os.environ.get(ENV_VAR, "auto") or "auto", ENV_VAR)


def load_triton():
    """Import the Triton kernel modules ``(chunk_triton, recurrent_triton)``; raises
    :class:`KernelBackendError` with the fix if Triton is unusable."""
    try:
        from kernels.hybrid import chunk_triton, recurrent_triton
    except ImportError as exc:
        raise KernelBackendError(str(exc)) from exc
    return chunk_triton, recurrent_triton


def _triton_problem(device: torch.device) -> str | None:
    """Why the Triton kernels cannot run on ``device`` (None when they can)."""
    try:
        load_triton()
    except KernelBackendError as exc:
        cause = exc.__cause__.__cause__ if exc.__cause__ is not None and exc.__cause__.__cause__ is not None else exc.__cause__
        return (
            f"the `triton` package failed to import ({cause!r}); install a Triton build matching your torch "
            "(`pip install triton`; CUDA wheels of torch ship with it)"
        )
    from kernels._triton import INTERPRETER

    if device.type == "cuda":
        if INTERPRETER:
            return "Triton was imported with TRITON_INTERPRET=1 (CPU interpreter), which cannot run on CUDA tensors; unset it"
        return None
    if INTERPRETER:
        return None
    return (
        f"the tensors are on {device.type}, and the Triton kernels need a CUDA device "
        "(or Triton's CPU interpreter: TRITON_INTERPRET=1 set before triton is first imported; slow, for tests)"
    )


def _smoke_test(device: torch.device, signature: tuple) -> str | None:
    """Compile and run the kernels (forward and backward) once on a tiny input with the given
    (kind, head dim, feature dim, dtype, feature dtype, decaying history, sink tokens) on
    ``device``; the failure text or None.

    A broken toolchain (compiler, driver, ptxas) or a tiling the device cannot hold shows here, at
    the first call, rather than at the first backward pass of a run."""
    key = (str(device),) + signature
    if key not in _smoke:
        kind, d, Fd, dtype, fdtype, decayed, sinks = signature
        # with sinks, long enough that the last 64-row query block reads them beside its key loop
        L, rule = (136, WindowRule(kind, 8, 2)) if sinks else (40, WindowRule(kind, 8))
        try:
            chunk_triton, _ = load_triton()
            g = torch.Generator(device="cpu").manual_seed(0)
            mask = torch.ones(2, L, dtype=torch.long)
            mask[1, :5] = 0
            inputs = [torch.randn(2, n, L, d, generator=g).to(device, dtype) for n in (2, 1, 1)]
            inputs += [torch.rand(2, 2, L, Fd, generator=g).to(device, fdtype) for _ in range(2)]
            inputs += [torch.zeros(2, device=device)]
            decay = torch.tensor([0.8, 0.95]).log().to(device) if decayed else None
            mask = mask.to(device)
            with torch.inference_mode(False), torch.enable_grad():
                outs = []
                for fn in (chunk_triton.hybrid_attention_triton, hybrid_attention_torch):
                    leaves = [t.clone().requires_grad_() for t in inputs]
                    y = fn(*leaves, rule, mask, decay=decay)
                    y.float().sum().backward()
                    outs.append([y.detach()] + [leaves[i].grad for i in (2, 3)])  # y, dv, dq_feat
            worst = max(((a.float() - b.float()).norm() / b.float().norm().clamp(min=1e-12)).item() for a, b in zip(*outs))
            tol = 1e-3 if dtype == torch.float32 else 5e-2
            _smoke[key] = None if worst < tol else f"the kernels ran but disagree with the PyTorch form (relative error {worst:.2e})"
        except Exception as exc:  # noqa: BLE001 - whatever fails is the reason
            _smoke[key] = f"compiling or running the kernels failed: {exc!r}"
    return _smoke[key]


def select_backend(device: torch.device | str, backend: str | None = None, signature: tuple | None = None) -> str:
    """``"triton"`` or ``"torch"`` for tensors on ``device`` (see the module docstring).

    ``signature``: (kind, head dim, feature dim, dtype, feature dtype, decaying history, sink
    tokens) of the call, for the one-off smoke test on CUDA. Default: ``None`` (a small float32
    terraced problem with a decaying history and sink tokens)."""
    device = torch.device(device)
    name = requested_backend(backend)
    if name == "torch":
        return "torch"
    signature = signature or ("terraced", 16, 16, torch.float32, torch.float32, True, True)
    if name == "triton":
        problem = _triton_problem(device)
        if problem is None and device.type == "cuda":
            problem = _smoke_test(device, signature)
        if problem is not None:
            raise KernelBackendError(f"{ENV_VAR}=triton was requested but {problem}. Use {ENV_VAR}=torch or auto for the PyTorch form.")
        return "triton"
    # auto: Triton only for CUDA tensors, and only when it works there
    if device.type != "cuda":
        return "torch"
    problem = _triton_problem(device) or _smoke_test(device, signature)
    if problem is not None:
        key = (str(device),) + signature
        if key not in _warned:
            _warned.add(key)
            warnings.warn(f"LoLCATs Triton kernels unavailable on {device} ({problem}); using the PyTorch form", stacklevel=3)
        return "torch"
    return "triton"


def _signature(kind: str, q: torch.Tensor, q_feat: torch.Tensor, decay, sinks: int = 0) -> tuple:
    """The smoke test's key of a call (:func:`select_backend`)."""
    return (kind, q.shape[-1], q_feat.shape[-1], q.dtype, q_feat.dtype, decay is not None, sinks > 0)


def check_inputs(q, k, v, q_feat, k_feat, mix, rule, attention_mask=None, decay=None) -> None:
    """The contract of :func:`hybrid_attention` on its inputs: raises ``ValueError`` naming the
    expected and the given shapes (``TypeError`` when ``rule`` is not a :class:`WindowRule`; the
    rule checks its kind, window and sink tokens itself)."""
    if not isinstance(rule, WindowRule):
        raise TypeError(f"rule must be a kernels.hybrid.window.WindowRule(kind, window_size, sinks); got {rule!r}")
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"q, k, v must be 4-D [B, H, L, d]; got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    B, H, L, d = q.shape
    if k.shape != v.shape or k.shape[0] != B or k.shape[2] != L or k.shape[3] != d:
        raise ValueError(f"k and v must be [B, H_kv, L, d] = [{B}, H_kv, {L}, {d}]; got {tuple(k.shape)}, {tuple(v.shape)}")
    if H % k.shape[1] != 0:
        raise ValueError(f"query heads ({H}) must be a multiple of key/value heads ({k.shape[1]})")
    Hs = k_feat.shape[1] if k_feat.dim() == 4 else -1
    if q_feat.dim() != 4 or q_feat.shape[:3] != (B, H, L) or Hs not in (H, k.shape[1]) \
            or k_feat.shape != (B, Hs, L, q_feat.shape[-1]):
        raise ValueError(
            f"q_feat must be [B, H, L, F] and k_feat [B, H, L, F] or [B, H_kv, L, F] with B, H, H_kv, L = "
            f"{B}, {H}, {k.shape[1]}, {L}; got {tuple(q_feat.shape)}, {tuple(k_feat.shape)}"
        )
    if mix.shape != (H,):
        raise ValueError(f"mix must have shape [H] = [{H}]; got {tuple(mix.shape)}")
    if attention_mask is not None and attention_mask.shape != (B, L):
        raise ValueError(f"attention_mask must be [B, L] = [{B}, {L}]; got {tuple(attention_mask.shape)}")
    if decay is not None and decay.shape != (Hs,):
        raise ValueError(f"decay must have one rate per head of k_feat, [{Hs}]; got {tuple(decay.shape)}")


def hybrid_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_feat: torch.Tensor,
    k_feat: torch.Tensor,
    mix: torch.Tensor,
    rule: WindowRule,
    attention_mask: torch.Tensor | None = None,
    scale: float | None = None,
    *,
    decay: torch.Tensor | None = None,
    backend: str | None = None,
) -> torch.Tensor:
    """LoLCATs linear / sliding-window / terraced hybrid attention (causal). For query n
    (``kernels/hybrid/chunk_torch.py``, docs/kernels.md)

        y_n = (sum_{j in W(n)} g_h exp(q_n.k_j/sqrt(d) - c_n) v_j + phi_q(q_n)^T S_hist(n))
              / (sum_{j in W(n)} g_h exp(q_n.k_j/sqrt(d) - c_n)   + phi_q(q_n)^T z_hist(n))

    with g_h = sigmoid(mix_h), c_n the window max, one joint normaliser and the linear term not
    rescaled by exp(-c_n) (paper Eq. 6); W(n) and the history are the ``rule``'s
    (``kernels/hybrid/window.py``). Optional sink tokens: the first s keys stay in W(n) for every
    later query and out of the history. Optional decay: each history term weighted by
    gamma_h^(its age past the window's edge) (``kernels/hybrid/decay.py``).

    Args:
        q: ``[B, H, L, d]`` queries after RoPE.
        k, v: ``[B, H_kv, L, d]`` keys (after RoPE) and values; H must be a multiple of H_kv
            (grouped-query attention; do not repeat them).
        q_feat: ``[B, H, L, F]`` feature map phi_q(q) per query head; must be non-negative.
        k_feat: ``[B, H, L, F]`` feature map phi_k(k) per query head, or ``[B, H_kv, L, F]`` per
            key/value head, shared by the group's query heads (``kernels/hybrid/heads.py``);
            must be non-negative.
        mix: ``[H]`` mixing logits; the window weight is sigmoid(mix). Ignored by ``linear``.
        rule: the window rule, :class:`kernels.hybrid.window.WindowRule` ``(kind, window_size,
            sinks)``: the kind (``linear``, ``sliding_window`` or ``terraced``), w, the window
            (sliding) or tile (terraced) length, and s, the sink tokens (keys at positions < s stay
            in the softmax part for every later query and never enter the linear history; not
            with ``linear``).
        attention_mask: ``[B, L]``, 1 for tokens and 0 for padding. Padded keys contribute
            nothing; outputs at padded queries are unspecified (finite). Window and tile
            positions count from each row's first real token. Default: ``None`` (no padding).
        scale: score scale. Default: ``None`` (``d ** -0.5``).
        decay: ``[H_s]`` log gamma_h <= 0, one per head of ``k_feat``: history key j of query n weighted by
            gamma_h^(window_start(p_n) - 1 - p_j). Default: ``None`` (no decay, the paper's).
        backend: ``auto``, ``triton`` or ``torch`` (module docstring). Default: ``None`` (the
            process's choice, :func:`set_backend` or ``LOLCATS_KERNELS``).

    Returns:
        ``[B, H, L, d]`` in the dtype of ``q`` (accumulation in float32).

    Raises:
        ValueError: a shape that breaks the contract (:func:`check_inputs`; a bad kind, window or
            sink count is refused when the :class:`WindowRule` is made).
        KernelBackendError: ``triton`` requested where it cannot run.

    Example::

        rule = WindowRule("terraced", window_size=64, sinks=4)
        y = hybrid_attention(q, k, v, q_feat, k_feat, mix, rule, attention_mask)
    """
    check_inputs(q, k, v, q_feat, k_feat, mix, rule, attention_mask, decay)
    H = q.shape[1]
    k_feat, decay = query_heads(k_feat, H), query_heads(decay, H, dim=0)  # the parallel forms read per query head
    if select_backend(q.device, backend, _signature(rule.kind, q, q_feat, decay, rule.sinks)) == "triton":
        chunk_triton, _ = load_triton()
        return chunk_triton.hybrid_attention_triton(q, k, v, q_feat, k_feat, mix, rule, attention_mask, scale, decay=decay)
    return hybrid_attention_torch(q, k, v, q_feat, k_feat, mix, rule, attention_mask, scale, decay=decay)


def decode_step(
    state: HybridState, rule: WindowRule, q, k, v, q_feat, mix, valid, key_features: KeyFeatures, scale: float,
    decay=None, *, backend: str | None = None,
) -> tuple[torch.Tensor, HybridState]:
    """One decode step through the selected backend; arguments and result as
    :func:`kernels.hybrid.recurrent_torch.decode_step_torch`."""
    if select_backend(q.device, backend, _signature(rule.kind, q, q_feat, decay)) == "triton":
        _, recurrent_triton = load_triton()
        return recurrent_triton.decode_step_triton(state, rule, q, k, v, q_feat, mix, valid, key_features, scale, decay)
    return recurrent_torch.decode_step_torch(state, rule, q, k, v, q_feat, mix, valid, key_features, scale, decay)


__all__ = [
    "BACKENDS",
    "ENV_VAR",
    "HybridState",
    "KernelBackendError",
    "WindowRule",
    "check_inputs",
    "decode_step",
    "hybrid_attention",
    "load_triton",
    "prefill_chunk",
    "prefill_state",
    "requested_backend",
    "select_backend",
    "set_backend",
]
