"""core.models.fit: a conversion config checked against its model's config.json, without torch."""

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import gguf
import pytest

import core.models.gguf as gguf_source
from core.models import (
    BUNDLED_MODEL,
    PROVENANCE_FILE,
    TINY_MODEL,
    ModelFitError,
    ModelLoadError,
    check_model_fit,
    read_gguf_metadata,
    read_model_config,
)

ROOT = Path(__file__).resolve().parents[3]
LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 4,
         "max_position_embeddings": 128, "rope_theta": 10000.0}


def fit_config(source, softmax_layers=(), seq_len=64, trust_remote_code=False):
    """The fields of a ConvertConfig that check_model_fit reads."""
    return SimpleNamespace(
        model=SimpleNamespace(source=str(source), trust_remote_code=trust_remote_code),
        attention=SimpleNamespace(softmax_layers=list(softmax_layers)),
        data=SimpleNamespace(seq_len=seq_len),
    )


def model_folder(path, config):
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    return path


def write_gguf(path, arch, **fields):
    """A GGUF file with a header only: ``<arch>.<key>`` uint32 fields plus a vocabulary array."""
    writer = gguf.GGUFWriter(path, arch)
    for key, value in fields.items():
        writer.add_uint32(f"{arch}.{key}", value)
    writer.add_float32(f"{arch}.rope.freq_base", 10000.0)
    writer.add_array("tokenizer.ggml.tokens", ["<s>", "a", "b"])
    writer.add_array("tokenizer.ggml.scores", [0.0, -1.0, -2.0])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


# ---------------------------------------------------------------------------- the tiny model


def test_tiny_model_fits_within_its_layers_and_positions():
    check_model_fit(fit_config(TINY_MODEL, softmax_layers=[0, 1], seq_len=2048))
    with pytest.raises(ModelFitError) as err:
        check_model_fit(fit_config(TINY_MODEL, softmax_layers=[1, 2]))
    assert str(err.value) == (
        "attention.softmax_layers [2] out of range: model 'tiny-random-llama' has 2 layers; use layer indices 0..1"
    )
    with pytest.raises(ModelFitError, match=r"^data\.seq_len 4096 is above the model's maximum positions \(2048, "
                                            r"config\.max_position_embeddings\); use data\.seq_len <= 2048$"):
        check_model_fit(fit_config(TINY_MODEL, seq_len=4096))


def test_a_real_convert_config_is_checked():
    from core.config import ConvertConfig

    cfg = ConvertConfig(model={"source": TINY_MODEL}, attention={"softmax_layers": [3]}, data={"seq_len": 64})
    with pytest.raises(ModelFitError, match=r"attention\.softmax_layers \[3\] out of range"):
        check_model_fit(cfg)


# ---------------------------------------------------------------------------- the bundled model


def test_bundled_model_from_the_gguf_header(tmp_path):
    workspace = tmp_path / "ws"
    config = read_model_config(BUNDLED_MODEL, workspace)
    assert config["model_type"] == "llama"
    assert (config["num_hidden_layers"], config["max_position_embeddings"]) == (30, 8192)
    assert (config["hidden_size"], config["num_attention_heads"], config["num_key_value_heads"]) == (576, 9, 3)
    check_model_fit(fit_config(BUNDLED_MODEL, softmax_layers=[0, 29], seq_len=8192), workspace)
    with pytest.raises(ModelFitError, match=r"softmax_layers \[30\] out of range: model 'smollm2-135m-instruct' "
                                            r"has 30 layers; use layer indices 0\.\.29"):
        check_model_fit(fit_config(BUNDLED_MODEL, softmax_layers=[30]), workspace)
    with pytest.raises(ModelFitError, match=r"data\.seq_len 8193 is above"):
        check_model_fit(fit_config(BUNDLED_MODEL, seq_len=8193), workspace)
    assert list((workspace / "models").iterdir()) == []  # nothing was materialised


def test_bundled_model_from_its_materialised_folder(tmp_path, monkeypatch):
    workspace = tmp_path / "ws"
    folder = model_folder(workspace / "models" / BUNDLED_MODEL, LLAMA)
    (folder / PROVENANCE_FILE).write_text("{}")

    def no_gguf():
        raise AssertionError("the GGUF file was read although the folder exists")

    monkeypatch.setattr(gguf_source, "bundled_gguf_path", no_gguf)
    assert read_model_config(BUNDLED_MODEL, workspace) == LLAMA
    with pytest.raises(ModelFitError, match=r"has 4 layers"):
        check_model_fit(fit_config(BUNDLED_MODEL, softmax_layers=[4]), workspace)


# ---------------------------------------------------------------------------- local folders and GGUF files


def test_missing_path_names_the_field(tmp_path):
    with pytest.raises(ModelFitError, match=r"^model\.source: model path '.*no-such-model' does not exist; "
                                            r"check the path"):
        check_model_fit(fit_config(tmp_path / "no-such-model"))


def test_folder_without_config(tmp_path):
    (tmp_path / "README.md").write_text("not a model")
    with pytest.raises(ModelFitError, match=r"^model\.source: folder .* has no config\.json"):
        check_model_fit(fit_config(tmp_path))


def test_folder_config_is_read_without_weights(tmp_path):
    folder = model_folder(tmp_path / "llama", LLAMA)
    check_model_fit(fit_config(folder, softmax_layers=[3], seq_len=128))
    with pytest.raises(ModelFitError, match=r"data\.seq_len 129 is above the model's maximum positions \(128"):
        check_model_fit(fit_config(folder, seq_len=129))


@pytest.mark.parametrize(
    "config, words",
    [
        ({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_layer": 2},
         "'gpt2' (GPT2LMHeadModel), which has no rotary position embeddings (RoPE)"),
        ({"model_type": "bert", "architectures": ["BertModel"]}, "which is not a decoder-only causal language model"),
        ({"model_type": "phi3", "architectures": ["Phi3ForCausalLM"], "rope_theta": 1e4},
         "which is a RoPE decoder the conversion does not support yet"),
    ],
    ids=["gpt2", "bert", "phi3"],
)
def test_unsupported_architecture(tmp_path, config, words):
    with pytest.raises(ModelFitError) as err:
        check_model_fit(fit_config(model_folder(tmp_path / "m", config)))
    msg = str(err.value)
    assert msg.startswith("model.source: unsupported architecture: ") and words in msg
    assert "Supported architectures: llama, mistral, qwen2, qwen3" in msg and "\n" not in msg


def test_remote_code_needs_trust(tmp_path):
    folder = model_folder(tmp_path / "m", {**LLAMA, "auto_map": {"AutoConfig": "configuration_x.XConfig"}})
    with pytest.raises(ModelFitError, match=r"^model\.source: .*needs custom code.*trust_remote_code=True"):
        check_model_fit(fit_config(folder))
    check_model_fit(fit_config(folder, trust_remote_code=True))


def test_gguf_file_header(tmp_path):
    path = write_gguf(tmp_path / "m.gguf", "qwen2", block_count=3, context_length=256, embedding_length=32)
    metadata = read_gguf_metadata(path)
    assert metadata["general.architecture"] == "qwen2" and metadata["qwen2.block_count"] == 3
    assert "tokenizer.ggml.tokens" not in metadata  # arrays are skipped
    config = read_model_config(path, tmp_path / "ws")
    assert config == {"model_type": "qwen2", "num_hidden_layers": 3, "max_position_embeddings": 256,
                      "hidden_size": 32, "rope_theta": 10000.0}
    with pytest.raises(ModelFitError, match=r"has 3 layers"):
        check_model_fit(fit_config(path, softmax_layers=[3]), tmp_path / "ws")
    gpt2 = write_gguf(tmp_path / "gpt2.gguf", "gpt2", block_count=2)
    with pytest.raises(ModelFitError, match=r"unsupported architecture: '.*gpt2\.gguf' is model_type 'gpt2'"):
        check_model_fit(fit_config(gpt2), tmp_path / "ws")


def test_broken_gguf_file(tmp_path):
    garbage = tmp_path / "garbage.gguf"
    garbage.write_bytes(b"not a gguf file" * 100)
    with pytest.raises(ModelFitError, match=r"GGUF file .*garbage\.gguf is truncated or corrupted \(not a GGUF"):
        check_model_fit(fit_config(garbage), tmp_path / "ws")
    data = write_gguf(tmp_path / "m.gguf", "llama", block_count=3).read_bytes()
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelLoadError, match=r"truncated\.gguf is truncated or corrupted \(unexpected end"):
        read_model_config(truncated, tmp_path / "ws")


# ---------------------------------------------------------------------------- hub ids


def test_hub_model_from_the_local_cache_only(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    assert read_model_config("no-such-org/no-such-model") is None
    check_model_fit(fit_config("no-such-org/no-such-model", softmax_layers=[99], seq_len=10**6))  # skipped
    repo = tmp_path / "hub" / "models--org--cached"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("0123abcd")
    model_folder(repo / "snapshots" / "0123abcd", LLAMA)
    assert read_model_config("org/cached") == LLAMA
    with pytest.raises(ModelFitError, match=r"model 'org/cached' has 4 layers"):
        check_model_fit(fit_config("org/cached", softmax_layers=[4]))


# ---------------------------------------------------------------------------- no torch


def test_checks_import_neither_torch_nor_transformers(tmp_path):
    model_folder(tmp_path / "gpt2", {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]})
    script = f"""
import sys
from types import SimpleNamespace as NS
from core.models import ModelFitError, check_model_fit

def cfg(source, layers=(), seq_len=64):
    return NS(model=NS(source=source, trust_remote_code=False), attention=NS(softmax_layers=list(layers)),
              data=NS(seq_len=seq_len))

check_model_fit(cfg({TINY_MODEL!r}, [1]))
check_model_fit(cfg({BUNDLED_MODEL!r}, [29], 8192), {str(tmp_path / "ws")!r})
for bad in (cfg({TINY_MODEL!r}, [7]), cfg({str(tmp_path / "gpt2")!r}), cfg({str(tmp_path / "missing")!r})):
    try:
        check_model_fit(bad)
    except ModelFitError:
        pass
    else:
        raise AssertionError(bad)
loaded = [m for m in ("torch", "transformers") if m in sys.modules]
assert not loaded, loaded
"""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LOLCATS_WORKSPACE": str(tmp_path / "ws")}
    run = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
