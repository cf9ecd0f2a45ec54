"""A converted tiny decoder trains through the kernels: loss and parameter gradients (feature maps,
window factors, projections) agree with the PyTorch form, with left padding and GQA."""

import pytest
import torch

import core
from kernels import dispatch
from tests.kernels.conftest import DEVICE
from tests.kernels.utils import assert_close
from tests.tiny_models import tiny_model


@pytest.mark.parametrize("kind", ["sliding_window", "terraced"])
def test_tiny_model_loss_and_gradients(kind, monkeypatch):
    torch.manual_seed(0)
    model = core.linearize(
        tiny_model("llama", seed=0),
        core.AttentionSpec(kind=kind, window_size=8, feature_dim=8, feature_init="random"),
    ).to(DEVICE)
    with torch.no_grad():
        for m in core.lolcats_modules(model).values():
            m.mix.copy_(torch.randn_like(m.mix))
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 101, (2, 40), generator=g)
    mask = torch.ones(2, 40, dtype=torch.long)
    mask[1, :11] = 0
    ids, mask = ids.to(DEVICE), mask.to(DEVICE)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    results = {}
    for backend in ("torch", "triton"):
        monkeypatch.setenv(dispatch.ENV_VAR, backend)
        model.zero_grad()
        out = model(input_ids=ids, attention_mask=mask, position_ids=pos, labels=ids.masked_fill(mask == 0, -100))
        out.loss.backward()
        results[backend] = (out.loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    (loss_t, grads_t), (loss_k, grads_k) = results["torch"], results["triton"]
    assert_close("loss", loss_t, loss_k, 1e-5)
    assert grads_t.keys() == grads_k.keys()
    assert any("feature_map" in n for n in grads_t) and any(n.endswith(".mix") for n in grads_t)
    for name in grads_t:
        assert_close(name, grads_t[name], grads_k[name], 1e-4, 1e-7)
