"""The Triton chunked kernels (forward and backward) against the naive reference and the PyTorch form.

Runs on CUDA when present, otherwise through Triton's CPU interpreter (see conftest.py), at small
shapes. Gradients use a cotangent that is zero at padded queries (their outputs are unspecified).
"""

import pytest
import torch

from kernels import dispatch
from kernels.hybrid.chunk_torch import hybrid_attention_torch
from kernels.hybrid.chunk_triton import hybrid_attention_triton
from kernels.hybrid.naive import naive_hybrid_attention
from kernels.hybrid.window import KINDS, WindowRule
from tests.attention_inputs import make_inputs
from tests.kernels.conftest import DEVICE
from tests.kernels.hybrid.decoding import sample_decay
from tests.kernels.hybrid.prefill import check_chunk_triton
from tests.kernels.utils import GRAD_NAMES, assert_close, forward_backward


@pytest.mark.parametrize("L", [1, 63, 100], ids=lambda L: f"T{L}")
@pytest.mark.parametrize("kind", KINDS)
def test_chunk(kind, L):
    """GQA (4 query heads over 2 KV heads), left padding of 0 / 7 / 40 tokens, window 16, fp32."""
    tensors = make_inputs(3, 4, 2, L, 16, 8, pads=(0, min(7, L - 1), min(40, L - 1)), device=DEVICE)
    check_chunk_triton(kind, 16, tensors[:6], tensors[6], ratio=1e-5, grad_ratio=1e-5)


@pytest.mark.parametrize("kind", ["sliding_window", "terraced"])
def test_default_window_and_blocks(kind):
    """w = 64 with the default 64-row blocks: two tiles of history at L = 200; T2R features (may be 0)."""
    tensors = make_inputs(1, 2, 1, 200, 16, 16, feature_map="t2r", pads=(5,), seed=1, device=DEVICE)
    check_chunk_triton(kind, 64, tensors[:6], tensors[6], ratio=1e-5, grad_ratio=1e-5, against_torch=False)


@pytest.mark.parametrize("kind", KINDS)
def test_small_blocks_odd_window_inner_padding(kind):
    """32-query / 16-key blocks with w = 5 (windows straddle blocks), padding in the middle and on the right."""
    tensors = make_inputs(2, 2, 2, 63, 16, 8, seed=3, device=DEVICE)
    mask = torch.ones(2, 63, dtype=torch.long, device=DEVICE)
    mask[0, 20:26] = 0
    mask[1, 50:] = 0
    check_chunk_triton(kind, 5, tensors[:6], mask, ratio=1e-5, grad_ratio=1e-5, against_torch=False, block_t=32, block_s=16)


@pytest.mark.parametrize("kind", ["sliding_window", "terraced"])
def test_head_dim_64_features_128(kind):
    """The recipe's per-head sizes: d = 64, Hedgehog f = 64 (F = 128), G = 3."""
    tensors = make_inputs(1, 3, 1, 40, 64, 64, pads=(3,), seed=5, device=DEVICE)
    check_chunk_triton(kind, 16, tensors[:6], tensors[6], ratio=1e-5, grad_ratio=1e-5, against_torch=False)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("blocks", [pytest.param((32, 16), marks=pytest.mark.slow), (64, 64)],
                         ids=["small-blocks", "default-blocks"])
def test_decaying_history(kind, blocks):
    """A decaying history (gamma_h from 0.6 to 1 across heads): output and all seven gradients, log
    gamma's included, against the float64 oracle and the PyTorch form, with left padding, over
    several state chunks (L = 150) and key blocks shorter than the chunks."""
    tensors = make_inputs(2, 4, 2, 150, 16, 8, pads=(0, 37), seed=4, device=DEVICE)
    check_chunk_triton(kind, 16, tensors[:6], tensors[6], ratio=1e-5, grad_ratio=1e-5, decay=sample_decay(4),
                       block_t=blocks[0], block_s=blocks[1])


def test_head_dim_128_forward():
    tensors = make_inputs(1, 2, 1, 24, 128, 64, seed=6, device=DEVICE)
    q, k, v, qf, kf, mix, mask = tensors
    y = hybrid_attention_triton(q, k, v, qf, kf, mix, WindowRule("terraced", 8))
    ref = naive_hybrid_attention(*(t.cpu() for t in (q, k, v, qf, kf, mix)), WindowRule("terraced", 8))
    assert_close("o", ref, y, 1e-5)


@pytest.mark.parametrize("kind", ["sliding_window", "terraced"])
@pytest.mark.parametrize(
    "dtype, feat_dtype, ratio, grad_ratio",
    [
        (torch.bfloat16, torch.bfloat16, 2e-2, 3e-2),
        (torch.bfloat16, torch.float32, 2e-2, 3e-2),  # a bf16 model: the feature maps return float32
        (torch.float16, torch.float16, 2e-3, 5e-3),
    ],
    ids=["bf16", "bf16-fp32-features", "fp16"],
)
def test_half_precision(dtype, feat_dtype, ratio, grad_ratio, kind):
    """Half inputs, float32 accumulation, P and dP rounded to the input dtype for the tensor-core
    products: loose tolerance against the float64 oracle on the same (rounded) inputs."""
    tensors = make_inputs(2, 4, 2, 100, 16, 8, pads=(0, 9), dtype=dtype, feat_dtype=feat_dtype, device=DEVICE)
    check_chunk_triton(kind, 16, tensors[:6], tensors[6], ratio=ratio, grad_ratio=grad_ratio, against_torch=False, atol=1e-4)


def test_strided_inputs_without_mask():
    """q, k, v as [B, H, L, d] views of [B, L, H, d] storage (what the attention layer passes)."""
    B, H, Hkv, L, d = 2, 4, 2, 50, 16
    q, k, v, qf, kf, mix, _ = make_inputs(B, H, Hkv, L, d, 8, seed=8, device=DEVICE)
    qs, ks, vs = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
    assert not qs.is_contiguous()
    y = hybrid_attention_triton(qs, ks, vs, qf, kf, mix, WindowRule("sliding_window", 16))
    assert_close("o", hybrid_attention_torch(q, k, v, qf, kf, mix, WindowRule("sliding_window", 16)), y, 1e-5)


def test_falls_back_to_a_smaller_tiling_when_out_of_resources(monkeypatch):
    """A tiling the GPU cannot hold (OutOfResources at launch) is retried smaller, then remembered."""
    import triton

    import kernels.hybrid.chunk_triton as th

    real, tried = th._forward, []

    def forward(*args):
        tried.append(args[-1])
        if args[-1][1] > 32:
            raise triton.runtime.errors.OutOfResources(200_000, 100_000, "shared memory")
        return real(*args)

    monkeypatch.setattr(th, "_forward", forward)
    monkeypatch.setattr(th, "_WORKING", {})
    q, k, v, qf, kf, mix, mask = make_inputs(1, 2, 1, 70, 16, 8, pads=(3,), device=DEVICE)
    for _ in range(2):
        y = hybrid_attention_triton(q, k, v, qf, kf, mix, WindowRule("sliding_window", 16), mask)
        assert_close("o", hybrid_attention_torch(q, k, v, qf, kf, mix, WindowRule("sliding_window", 16), mask), y, 1e-5)
    assert tried == [(64, 64, 4, 2), (64, 32, 4, 1), (64, 32, 4, 1)]
    with pytest.raises(triton.runtime.errors.OutOfResources):  # an explicit tiling is used as given
        hybrid_attention_triton(q, k, v, qf, kf, mix, WindowRule("sliding_window", 16), mask, block_s=64)


def test_fully_padded_row_and_linear_gradients():
    """A row with no real token gives 0 and zero gradients; linear leaves q, k, mix without gradient."""
    q, k, v, qf, kf, mix, mask = make_inputs(2, 2, 1, 20, 16, 8, pads=(0, 20), device=DEVICE)
    y = hybrid_attention_triton(q, k, v, qf, kf, mix, WindowRule("terraced", 8), mask)
    assert torch.isfinite(y).all() and (y[1] == 0).all()
    leaves = [t.clone().requires_grad_() for t in (q, k, v, qf, kf, mix)]
    hybrid_attention_triton(*leaves, WindowRule("linear", 8), mask).sum().backward()
    assert leaves[0].grad is None and leaves[1].grad is None and leaves[5].grad is None
    assert (leaves[2].grad[1] == 0).all() and (leaves[4].grad[1] == 0).all()


@pytest.mark.parametrize("decayed", [False, True], ids=["paper", "decay"])
@pytest.mark.parametrize("kind", ["sliding_window", "terraced"])
def test_sink_tokens(kind, decayed):
    """4 sink tokens (the recipes'), GQA (2 query heads over 1 KV head), left padding of 0 / 9
    tokens, 32-query / 16-key blocks and w = 16, so later blocks read the sinks beside their key
    loop: output and every gradient against the float64 oracle and the PyTorch form."""
    tensors = make_inputs(2, 2, 1, 70, 16, 8, pads=(0, 9), seed=9, device=DEVICE)
    check_chunk_triton(kind, 16, tensors[:6], tensors[6], ratio=1e-5, grad_ratio=1e-5, sinks=4,
                       decay=sample_decay(2) if decayed else None, block_t=32, block_s=16)


@pytest.mark.parametrize("kind", ["sliding_window", "terraced"])
def test_sink_tokens_across_blocks(kind):
    """37 sink tokens, more than a key block (16): three blocks of sinks, the last of them inside
    the key loop of the last query block, which reads the first two beside it; w = 8, and a row
    of 70 padding tokens, shorter than the sinks."""
    tensors = make_inputs(2, 2, 1, 90, 16, 8, pads=(0, 70), seed=10, device=DEVICE)
    check_chunk_triton(kind, 8, tensors[:6], tensors[6], ratio=1e-5, grad_ratio=1e-5, sinks=37, block_t=32, block_s=16)


def test_sink_tokens_default_blocks_half_precision():
    """The recipe's rule (terraced, w 64, 4 sinks, a decay) at the default 64-row blocks in bfloat16
    with float32 features (a bf16 model's), d = 64: the bound of the half-precision test."""
    tensors = make_inputs(1, 2, 1, 200, 64, 16, pads=(6,), dtype=torch.bfloat16, feat_dtype=torch.float32, seed=11,
                          device=DEVICE)
    check_chunk_triton("terraced", 64, tensors[:6], tensors[6], ratio=2e-2, grad_ratio=3e-2, against_torch=False,
                       atol=1e-4, sinks=4, decay=sample_decay(2))


@pytest.mark.parametrize("kind", ["sliding_window", "terraced"])
def test_key_features_per_key_value_head_through_the_op(kind):
    """Key features and decay rates per key/value head reach the kernels through the op, which gives
    each query head its group's: output and every gradient (those of the per-key/value-head
    features and rates included) equal the PyTorch form's, with sinks and left padding."""
    q, k, v, qf, kf, mix, mask = make_inputs(3, 4, 2, 70, 16, 8, pads=(0, 7, 40), device=DEVICE)
    kf = kf[:, ::2].contiguous()  # [B, H_kv, L, F]
    decay = sample_decay(2)
    dy = torch.randn(q.shape, generator=torch.Generator().manual_seed(1)).to(DEVICE) * mask[:, None, :, None]
    rule = WindowRule(kind, 16, 2)
    outs = [forward_backward(dispatch.hybrid_attention, (q, k, v, qf, kf, mix), mask, dy, decay, rule=rule,
                             backend=backend) for backend in ("triton", "torch")]
    (y, grads), (y_ref, g_ref) = outs
    assert_close("o", y_ref, y, 1e-5)
    for name, ref, got in zip(GRAD_NAMES, g_ref, grads):
        assert ref.shape == got.shape and (name != "dk_feat" or got.shape[1] == 2)
        assert_close(name, ref, got, 1e-5, 1e-6)
