"""A converted model prefilled in chunks from its carried state equals one forward over the whole prompt."""

import pytest
import torch
from transformers import DynamicCache

from kernels import dispatch
from tests.core.attention.test_surgery import SINK_CASES, converted, left_padded_batch, positions, rel_err


@pytest.mark.parametrize("kind, sinks", SINK_CASES)
@pytest.mark.parametrize("softmax_layers", [(), (1,)], ids=["all", "hybrid"])
@torch.no_grad()
def test_chunked_prefill_equals_a_whole_forward_and_decodes_alike(monkeypatch, kind, sinks, softmax_layers):
    model = converted("llama", kind, window=16, softmax_layers=softmax_layers, sinks=sinks)
    steps = []
    real_step = dispatch.decode_step
    monkeypatch.setattr(dispatch, "decode_step", lambda *a, **k: steps.append(1) or real_step(*a, **k))
    ids, mask = left_padded_batch([90, 71, 30], 90)
    pos = positions(mask)
    full = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
    cache, logits = DynamicCache(config=model.config), []
    for a, b in ((0, 40), (40, 48), (48, 85), (85, 90)):  # chunks of 40, 8, 37 and 5 tokens
        out = model(input_ids=ids[:, a:b], attention_mask=mask[:, :b], position_ids=pos[:, a:b],
                    past_key_values=cache, use_cache=True)
        logits.append(out.logits)
    assert steps == []  # every chunk went through the parallel form, none token by token
    real = mask.bool()[:, :, None]
    chunked = torch.cat(logits, dim=1)
    assert rel_err(torch.where(real, chunked, 0.0), torch.where(real, full, 0.0)) < 1e-5

    step_ids = torch.randint(3, 101, (3, 1), generator=torch.Generator().manual_seed(5))
    longer = torch.cat([mask, torch.ones(3, 1, dtype=mask.dtype)], dim=1)
    step = model(input_ids=step_ids, attention_mask=longer, position_ids=pos[:, -1:] + 1, past_key_values=cache,
                 use_cache=True).logits
    whole = model(input_ids=torch.cat([ids, step_ids], dim=1), attention_mask=longer,
                  position_ids=positions(longer)).logits[:, -1:]
    assert rel_err(step, whole) < 1e-5
