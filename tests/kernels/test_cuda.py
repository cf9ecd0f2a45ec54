"""The compiled Triton kernels on a CUDA device, not the CPU interpreter: the chunked prefill
(forward and backward, with and without sink tokens) and the decode step against the PyTorch
references in float32 and bfloat16 with left padding, the automatic backend choosing them, and a converted tiny model generating on
CUDA, through the Triton prefill and decode step, what it generates on CPU through PyTorch.

Every test here is marked ``gpu``: on a machine without CUDA the suite skips them with the reason.
"""

import pytest
import torch

from kernels import dispatch
from kernels.hybrid.window import KINDS
from tests.attention_inputs import make_inputs
from tests.kernels.hybrid.decoding import check_decode_triton, sample_decay
from tests.kernels.hybrid.prefill import check_chunk_triton
from tests.kernels.utils import N_LAYERS, assert_close, converted_tiny

pytestmark = pytest.mark.gpu

HALF_KINDS = ["sliding_window", "terraced"]  # the hybrids, as in the half-precision interpreter tests


@pytest.fixture(autouse=True)
def _compiled_kernels(monkeypatch):
    """The kernels were compiled for the GPU (the CPU interpreter cannot take CUDA tensors), and
    the automatic backend is in effect."""
    from kernels._triton import INTERPRETER

    assert torch.cuda.is_available() and not INTERPRETER, "these tests need the compiled kernels on a CUDA device"
    monkeypatch.delenv(dispatch.ENV_VAR, raising=False)
    dispatch.set_backend(None)


def _auto_picks_triton(kind: str, tensors, decayed: bool = False, sinks: int = 0) -> None:
    q, q_feat = tensors[0], tensors[3]
    signature = (kind, q.shape[-1], q_feat.shape[-1], q.dtype, q_feat.dtype, decayed, sinks > 0)
    assert dispatch.select_backend(q.device, "auto", signature) == "triton"  # the smoke test passed


@pytest.mark.parametrize("decayed", [False, True], ids=["paper", "decay"])
@pytest.mark.parametrize("kind", KINDS)
def test_prefill_and_backward_float32(kind, decayed):
    """GQA, left padding of 0 / 7 / 70 tokens, three 64-row blocks: output and six gradients (and
    log gamma's with a decaying history)."""
    tensors = make_inputs(3, 4, 2, 150, 16, 8, pads=(0, 7, 70), device="cuda")
    _auto_picks_triton(kind, tensors, decayed)
    decay = sample_decay(4) if decayed else None
    check_chunk_triton(kind, 16, tensors[:6], tensors[6], ratio=1e-5, grad_ratio=1e-5, decay=decay)


@pytest.mark.parametrize("kind", HALF_KINDS)
@pytest.mark.parametrize("feat_dtype", [torch.bfloat16, torch.float32], ids=["bf16-features", "fp32-features"])
def test_prefill_and_backward_bfloat16(kind, feat_dtype):
    """bfloat16 inputs (the feature maps of a bf16 model return float32): against the float64
    reference on the same rounded inputs, the bound of the interpreter's half-precision test."""
    tensors = make_inputs(2, 4, 2, 150, 64, 32, pads=(0, 9), dtype=torch.bfloat16, feat_dtype=feat_dtype, device="cuda")
    _auto_picks_triton(kind, tensors)
    check_chunk_triton(kind, 16, tensors[:6], tensors[6], ratio=2e-2, grad_ratio=3e-2, against_torch=False, atol=1e-4)


@pytest.mark.parametrize("kind", HALF_KINDS)
def test_prefill_and_backward_with_sink_tokens_float32(kind):
    """4 sink tokens with a decaying history, GQA, left padding, 64-row blocks over L = 300, so
    the later blocks read the sinks beside their key loop."""
    tensors = make_inputs(2, 4, 2, 300, 16, 8, pads=(0, 70), seed=3, device="cuda")
    _auto_picks_triton(kind, tensors, decayed=True, sinks=4)
    check_chunk_triton(kind, 16, tensors[:6], tensors[6], ratio=1e-5, grad_ratio=1e-5, decay=sample_decay(4), sinks=4)


def test_recipe_attention_bfloat16():
    """paper-8b's attention in Llama-3-8B's head shape: terraced, w 64, 4 sink tokens, a decaying
    history; d 128, F 128, 4 query heads per KV head; bf16 with float32 features."""
    tensors = make_inputs(1, 8, 2, 400, 128, 64, pads=(5,), dtype=torch.bfloat16, feat_dtype=torch.float32, seed=4,
                          device="cuda")
    _auto_picks_triton("terraced", tensors, decayed=True, sinks=4)
    check_chunk_triton("terraced", 64, tensors[:6], tensors[6], ratio=2e-2, grad_ratio=3e-2, against_torch=False,
                       atol=1e-4, decay=sample_decay(8), sinks=4)


@pytest.mark.parametrize("kind", KINDS)
def test_decode_step_float32(kind):
    """Rows without padding, left-padded, and first real token during decoding; window 4 folds tiles."""
    check_decode_triton(kind, 4)


@pytest.mark.parametrize("kind", HALF_KINDS)
def test_decode_step_bfloat16(kind):
    check_decode_triton(kind, 4, dtype=torch.bfloat16, H=6, Hkv=2, d=64, f=32, T=6, ratio=2e-2)


@torch.no_grad()
@pytest.mark.parametrize("kind", HALF_KINDS)
def test_generate_on_cuda_matches_cpu(kind, backend_calls):
    """Greedy decoding of a left-padded batch with a prompt longer than the window: the same tokens
    and logits on CUDA (Triton kernels, chosen automatically) as on CPU (PyTorch form)."""
    ids = torch.randint(3, 101, (2, 12), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    mask[1, :4] = 0
    new = 5
    results = {}
    for device, backend in (("cpu", "torch"), ("cuda", "triton")):
        model = converted_tiny(kind, device).eval()
        backend_calls.clear()
        results[device] = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), max_new_tokens=new,
                                         min_new_tokens=new, do_sample=False, output_logits=True,
                                         return_dict_in_generate=True, pad_token_id=0)
        assert backend_calls == {f"hybrid_attention_{backend}": N_LAYERS,
                                 f"decode_step_{backend}": N_LAYERS * (new - 1)}
    cpu, cuda = results["cpu"], results["cuda"]
    assert torch.equal(cpu.sequences, cuda.sequences.cpu())
    for step, (a, b) in enumerate(zip(cpu.logits, cuda.logits)):
        assert_close(f"logits of token {step}", a, b, 1e-4)
