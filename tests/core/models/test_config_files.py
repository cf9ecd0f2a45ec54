"""core.models.config_files: config.json, architecture and weight-file checks, as load_model reports them."""

import pytest
from transformers import BertConfig, BertModel, GPT2Config, GPT2LMHeadModel

from core.models import ModelLoadError, check_seq_len, load_model
from tests.core.models.folders import SUPPORTED, copy_folder, edit_config, tiny_llama_config


def test_check_seq_len(tiny_folder):
    check_seq_len(tiny_folder[1], 256)
    with pytest.raises(ValueError, match=r"seq_len 512 is above the model's maximum positions \(256"):
        check_seq_len(tiny_folder[1], 512)


def test_error_folder_without_config(tmp_path):
    (tmp_path / "README.md").write_text("not a model")
    with pytest.raises(ModelLoadError, match=r"has no config.json, so it is not a Hugging Face model folder"):
        load_model(str(tmp_path))
    (tmp_path / "model.Q4_0.gguf").write_bytes(b"GGUF")
    with pytest.raises(ModelLoadError, match=r"pass that file instead: .*model\.Q4_0\.gguf"):
        load_model(str(tmp_path))


def test_error_folder_without_weights(tmp_path):
    tiny_llama_config().save_pretrained(tmp_path)
    with pytest.raises(ModelLoadError, match=r"no weight files \(\*\.safetensors\)"):
        load_model(str(tmp_path))


def test_error_trust_remote_code(tmp_path, tiny_folder):
    folder = copy_folder(tiny_folder[0], tmp_path / "tiny-remote-code")
    (folder / "configuration_tiny.py").write_text(
        "from transformers import LlamaConfig\n\n\nclass TinyConfig(LlamaConfig):\n    model_type = 'llama'\n"
    )
    (folder / "modeling_tiny.py").write_text(
        "from transformers import LlamaForCausalLM\n\nfrom .configuration_tiny import TinyConfig\n\n\n"
        "class TinyForCausalLM(LlamaForCausalLM):\n    config_class = TinyConfig\n"
    )
    edit_config(
        folder,
        auto_map={"AutoConfig": "configuration_tiny.TinyConfig", "AutoModelForCausalLM": "modeling_tiny.TinyForCausalLM"},
    )
    with pytest.raises(ModelLoadError) as err:
        load_model(str(folder))
    msg = str(err.value)
    assert "needs custom code" in msg and "'auto_map'" in msg and "trust_remote_code=True" in msg
    model, _ = load_model(str(folder), trust_remote_code=True, device="cpu")  # explicit opt-in loads
    assert type(model).__name__ == "TinyForCausalLM"


def test_error_truncated_safetensors(tmp_path, tiny_folder):
    folder = copy_folder(tiny_folder[0], tmp_path / "truncated")
    weights = folder / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelLoadError, match=r"model\.safetensors is truncated: \d+ bytes, expected \d+; re-download"):
        load_model(str(folder))


def test_error_corrupted_safetensors(tmp_path, tiny_folder):
    folder = copy_folder(tiny_folder[0], tmp_path / "corrupted")
    weights = folder / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[8:16] = b"garbage!"  # inside the JSON header
    weights.write_bytes(bytes(data))
    with pytest.raises(ModelLoadError, match=r"model\.safetensors is corrupted \(.*\); re-download"):
        load_model(str(folder))


def test_error_gpt2_unsupported(tmp_path):
    GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=100, n_positions=64)).save_pretrained(tmp_path)
    with pytest.raises(ModelLoadError) as err:
        load_model(str(tmp_path))
    msg = str(err.value)
    assert msg.startswith("unsupported architecture") and "'gpt2'" in msg
    assert "no rotary position embeddings (RoPE)" in msg and SUPPORTED in msg


def test_error_bert_unsupported(tmp_path):
    BertModel(
        BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, vocab_size=100)
    ).save_pretrained(tmp_path)
    with pytest.raises(ModelLoadError) as err:
        load_model(str(tmp_path))
    msg = str(err.value)
    assert "'bert' (BertModel)" in msg and "not a decoder-only causal language model" in msg and SUPPORTED in msg
