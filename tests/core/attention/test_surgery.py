"""Model surgery and recurrent decoding on tiny random decoders (float32, random weights)."""

import copy

import pytest
import torch
from transformers import DynamicCache, GPT2Config, GPT2LMHeadModel

import core
from kernels.hybrid.window import KINDS
from tests.tiny_models import tiny_model


def rel_err(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def left_padded_batch(lengths, total, vocab=101, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (len(lengths), total), generator=g)
    mask = torch.zeros(len(lengths), total, dtype=torch.long)
    for b, n in enumerate(lengths):
        mask[b, total - n :] = 1
    ids = ids.masked_fill(mask == 0, 0)
    return ids, mask


def positions(mask):
    return (mask.cumsum(-1) - 1).clamp(min=0)


def converted(arch="llama", kind="terraced", window=16, softmax_layers=(), seed=0, sinks=0, history_norm="decay",
              feature_positions="none", key_map_heads="query", history_gate="none"):
    """A tiny converted model; ``history_norm`` and ``feature_positions`` default to the library's."""
    model = tiny_model(arch, seed=seed)
    cfg = core.AttentionSpec(
        kind=kind, window_size=window, feature_dim=8, softmax_layers=list(softmax_layers), feature_init="random",
        sink_tokens=sinks, history_norm=history_norm, feature_positions=feature_positions, key_map_heads=key_map_heads,
        history_gate=history_gate,
    )
    torch.manual_seed(seed + 1)
    model = core.linearize(model, cfg)
    with torch.no_grad():  # move the window weights and history exponents away from their shared init
        for m in core.lolcats_modules(model).values():
            m.mix.copy_(torch.randn_like(m.mix))
            if history_norm == "power":
                m.history_power.copy_(torch.randn_like(m.history_power))
            if history_norm == "decay":  # gamma from about 0.7 to 0.95: the decay shows within a short test
                m.history_decay.copy_(torch.randn_like(m.history_decay) + 2)
            if history_gate == "query":  # gates from about 0.1 to 1.9 across queries
                m.history_gate.weight.copy_(torch.randn_like(m.history_gate.weight) * 2)
                m.history_gate.bias.copy_(torch.randn_like(m.history_gate.bias))
    return model


SINK_CASES = [(kind, 0) for kind in KINDS] + [("sliding_window", 2), ("terraced", 4)]


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2", "qwen3", "gemma3"])
@pytest.mark.parametrize("kind, sinks", SINK_CASES)
@pytest.mark.parametrize("softmax_layers", [(), (1,)], ids=["all", "hybrid"])
@torch.no_grad()
def test_prefill_plus_decode_equals_full_forward(arch, kind, sinks, softmax_layers):
    model = converted(arch, kind, window=16, softmax_layers=softmax_layers, sinks=sinks)
    ids, mask = left_padded_batch([70, 55, 30], 90)
    full = model(input_ids=ids, attention_mask=mask, position_ids=positions(mask)).logits
    prefix = 45
    cache = DynamicCache(config=model.config)
    out = model(
        input_ids=ids[:, :prefix], attention_mask=mask[:, :prefix], position_ids=positions(mask)[:, :prefix],
        past_key_values=cache, use_cache=True,
    )
    logits = [out.logits]
    for t in range(prefix, ids.shape[1]):
        out = model(
            input_ids=ids[:, t : t + 1], attention_mask=mask[:, : t + 1], position_ids=positions(mask)[:, t : t + 1],
            past_key_values=cache, use_cache=True,
        )
        logits.append(out.logits)
    stepped = torch.cat(logits, dim=1)
    real = mask.bool()
    assert rel_err(stepped[real], full[real]) <= 1e-4


@pytest.mark.parametrize("kind", ["sliding_window", "terraced"])
def test_decode_after_an_inference_mode_prefill(kind):
    """The window cache is a fixed ring written in place; a prefill made under inference_mode can
    be continued under no_grad (the cache is copied once) and gives the full forward's logits."""
    model = converted("llama", kind, window=8)
    ids, mask = left_padded_batch([40, 33], 40)
    with torch.no_grad():
        full = model(input_ids=ids, attention_mask=mask, position_ids=positions(mask)).logits
    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        out = model(input_ids=ids[:, :20], attention_mask=mask[:, :20], position_ids=positions(mask)[:, :20],
                    past_key_values=cache, use_cache=True)
    logits = [out.logits]
    with torch.no_grad():
        for t in range(20, 40):
            out = model(input_ids=ids[:, t : t + 1], attention_mask=mask[:, : t + 1],
                        position_ids=positions(mask)[:, t : t + 1], past_key_values=cache, use_cache=True)
            logits.append(out.logits)
    stepped = torch.cat(logits, dim=1)
    assert rel_err(stepped[mask.bool()], full[mask.bool()]) <= 1e-4
    state = cache.layers[0].state
    assert state.seen == 40 and state.win_k.shape[2] == (8 if kind == "sliding_window" else 16)
    assert not state.win_k.is_inference()


@pytest.mark.parametrize("kind", KINDS)
@torch.no_grad()
def test_padded_row_equals_row_alone(kind):
    model = converted("llama", kind, window=16)
    ids, mask = left_padded_batch([80, 37], 80, seed=3)
    batch = model(input_ids=ids, attention_mask=mask, position_ids=positions(mask)).logits
    alone = model(input_ids=ids[1:, -37:]).logits
    assert rel_err(batch[1, -37:], alone[0]) <= 1e-5


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2", "qwen3"])
@torch.no_grad()
def test_window_covering_input_reproduces_original(arch):
    original = tiny_model(arch, seed=4)
    model = core.linearize(copy.deepcopy(original), core.AttentionSpec(kind="sliding_window", window_size=128))
    ids, mask = left_padded_batch([100, 64], 100, seed=5)
    kwargs = dict(input_ids=ids, attention_mask=mask, position_ids=positions(mask))
    ref, got = original(**kwargs).logits, model(**kwargs).logits
    real = mask.bool()
    assert rel_err(got[real], ref[real]) <= 1e-5


@pytest.mark.parametrize("kind, sinks", SINK_CASES)
@torch.no_grad()
def test_generate_batched_left_padding_matches_uncached_greedy(kind, sinks):
    model = converted("llama", kind, window=8, softmax_layers=(2,), sinks=sinks)
    model.generation_config.pad_token_id = 0
    ids, mask = left_padded_batch([20, 13, 7], 20, seed=6)
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=12, do_sample=False)
    assert out.shape == (3, 32)
    # greedy reference without any cache: rerun the whole sequence each step
    seq, m = ids.clone(), mask.clone()
    done = torch.zeros(3, dtype=torch.bool)
    for _ in range(12):
        logits = model(input_ids=seq, attention_mask=m, position_ids=positions(m), use_cache=False).logits
        nxt = logits[:, -1].argmax(-1).masked_fill(done, 0)  # finished rows get the pad token, as generate does
        done |= nxt == model.config.eos_token_id
        seq = torch.cat([seq, nxt[:, None]], dim=1)
        m = torch.cat([m, torch.ones(3, 1, dtype=m.dtype)], dim=1)
    assert torch.equal(out, seq)


@torch.no_grad()
def test_generate_sampling_runs_and_is_seeded():
    model = converted("qwen3", "terraced", window=8)
    model.generation_config.pad_token_id = 0
    ids, mask = left_padded_batch([10, 6], 10, seed=7)
    torch.manual_seed(0)
    a = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=20, do_sample=True, top_k=20)
    torch.manual_seed(0)
    b = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=20, do_sample=True, top_k=20)
    assert a.shape == (2, 30) and torch.equal(a, b)


def test_only_feature_maps_mix_and_history_exponents_are_trainable():
    model = converted("llama", "terraced", softmax_layers=(0,), history_norm="power")
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(("feature_map" in n or n.endswith((".mix", ".history_power"))) for n in trainable)
    assert any(n.endswith(".history_power") for n in trainable)
    assert not any(n.startswith("model.layers.0.") for n in trainable)
    assert "model.layers.1.self_attn.q_proj.weight" in dict(model.named_parameters())  # names unchanged


def test_unsupported_architecture_error():
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=50))
    with pytest.raises(core.UnsupportedModelError, match=r"unsupported architecture 'gpt2' \(GPT2LMHeadModel\).*llama, mistral, qwen2, qwen3"):
        core.linearize(gpt2, core.AttentionSpec())


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(kind="tk"), "unknown attention kind 'tk'; valid kinds: linear, sliding_window, terraced"),
        (dict(feature_map="hedgehug"), "unknown feature map 'hedgehug'; valid feature maps: hedgehog, t2r"),
        (dict(window_size=0), "window_size must be an integer >= 1, got 0"),
        (dict(feature_dim=-4), "feature_dim must be an integer >= 1, got -4"),
        (dict(softmax_layers=[1, 1]), r"softmax_layers lists layer\(s\) \[1\] more than once"),
        (dict(init_mix=1.0), r"init_mix must be in \(0, 1\)"),
    ],
)
def test_config_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        core.AttentionSpec(**kwargs)


def test_softmax_layers_out_of_range():
    with pytest.raises(ValueError, match=r"softmax_layers \[3\] out of range: the model has 3 layers"):
        core.linearize(tiny_model(), core.AttentionSpec(softmax_layers=[3]))


def test_converting_twice_is_refused():
    model = converted()
    with pytest.raises(ValueError, match="already linearized"):
        core.linearize(model, core.AttentionSpec())


@pytest.mark.parametrize("arch, overrides", [("llama", {}), ("mistral", {"sliding_window": 24}), ("qwen2", {}),
                                             ("qwen3", {}), ("gemma3", {})],
                         ids=["llama", "mistral-window-24", "qwen2", "qwen3", "gemma3"])
@torch.no_grad()
def test_teacher_mode_is_the_unconverted_model_on_every_family(arch, overrides):
    """Inputs longer than Mistral's and Gemma 3's own sliding windows (24): teacher mode keeps them."""
    original = tiny_model(arch, seed=1, **overrides)
    model = core.linearize(copy.deepcopy(original), core.AttentionSpec(window_size=8, feature_dim=8))
    ids, mask = left_padded_batch([60, 41], 60, seed=2)
    kwargs = dict(input_ids=ids, attention_mask=mask, position_ids=positions(mask))
    real = mask.bool()
    with core.teacher_attention(core.lolcats_modules(model).values()):
        assert rel_err(model(**kwargs).logits[real], original(**kwargs).logits[real]) <= 1e-6
    if overrides:  # the model's own window matters on these inputs
        widened = copy.deepcopy(original)
        widened.config.sliding_window = None
        for layer in widened.model.layers:
            layer.self_attn.sliding_window = None
        assert rel_err(widened(**kwargs).logits[real], original(**kwargs).logits[real]) > 1e-3
    assert rel_err(model(**kwargs).logits[real], original(**kwargs).logits[real]) > 1e-3  # the student differs
