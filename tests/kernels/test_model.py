"""A converted tiny decoder through the kernels: loss and parameter gradients (feature maps,
window factors, projections) agree with the PyTorch form, with left padding and GQA; greedy
generation decodes through the Triton decode step and gives the PyTorch form's tokens. Spies
count the backend calls, so a silent fallback to PyTorch fails."""

import pytest
import torch

from kernels import dispatch
from tests.kernels.conftest import DEVICE
from tests.kernels.utils import N_LAYERS, assert_close, converted_tiny


@pytest.mark.parametrize("kind", ["sliding_window", "terraced"])
def test_tiny_model_loss_and_gradients(kind, monkeypatch, backend_calls):
    model = converted_tiny(kind, DEVICE)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 101, (2, 40), generator=g)
    mask = torch.ones(2, 40, dtype=torch.long)
    mask[1, :11] = 0
    ids, mask = ids.to(DEVICE), mask.to(DEVICE)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    results = {}
    for backend in ("torch", "triton"):
        monkeypatch.setenv(dispatch.ENV_VAR, backend)
        backend_calls.clear()
        model.zero_grad()
        out = model(input_ids=ids, attention_mask=mask, position_ids=pos, labels=ids.masked_fill(mask == 0, -100))
        out.loss.backward()
        results[backend] = (out.loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
        assert backend_calls == {f"hybrid_attention_{backend}": N_LAYERS}  # every layer, this backend only
    (loss_t, grads_t), (loss_k, grads_k) = results["torch"], results["triton"]
    assert_close("loss", loss_t, loss_k, 1e-5)
    assert grads_t.keys() == grads_k.keys()
    assert any("feature_map" in n for n in grads_t) and any(n.endswith(".mix") for n in grads_t)
    for name in grads_t:
        assert_close(name, grads_t[name], grads_k[name], 1e-4, 1e-7)


@torch.no_grad()
@pytest.mark.parametrize("kind", ["sliding_window", "terraced"])
def test_generate_decodes_through_the_triton_step(kind, monkeypatch, backend_calls):
    """A prompt longer than the window, so the decode steps fold keys into the state."""
    model = converted_tiny(kind, DEVICE).eval()
    ids = torch.randint(3, 101, (1, 12), generator=torch.Generator().manual_seed(2)).to(DEVICE)
    new = 5
    results = {}
    for backend in ("torch", "triton"):
        monkeypatch.setenv(dispatch.ENV_VAR, backend)
        backend_calls.clear()
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                             do_sample=False, output_logits=True, return_dict_in_generate=True, pad_token_id=0)
        results[backend] = out
        # the prompt through the sequence form, then one decode step per layer for each later token
        assert backend_calls == {f"hybrid_attention_{backend}": N_LAYERS, f"decode_step_{backend}": N_LAYERS * (new - 1)}
    torch_out, triton_out = results["torch"], results["triton"]
    assert torch.equal(torch_out.sequences, triton_out.sequences)
    for step, (a, b) in enumerate(zip(torch_out.logits, triton_out.logits)):
        assert_close(f"logits of token {step}", a, b, 1e-5)
