"""An export loads with plain transformers (``trust_remote_code=True``) in a Python that cannot
import this project, and matches the project's own loader: logits and cached greedy generation."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from core.config import preset
from core.export.modeling import MODEL_CLASS, MODELING_FILE, modeling_source
from core.pipeline.convert import run_convert
from core.export.folder import export
from core.load import load_converted

pytestmark = pytest.mark.slow  # Llama and Gemma 3 exports loaded by plain transformers

IDS = torch.randint(5, 1000, (2, 40), generator=torch.Generator().manual_seed(0))
NEW_TOKENS = 24

# Runs with the project off the path: no PYTHONPATH, a temporary cwd, and the editable install's
# finder taken out of sys.meta_path / sys.path_hooks before anything is imported.
PLAIN_LOAD = textwrap.dedent('''
    import json, sys
    sys.meta_path[:] = [f for f in sys.meta_path if "__editable__" not in getattr(f, "__module__", "")]
    sys.path_hooks[:] = [h for h in sys.path_hooks if "__editable__" not in getattr(h, "__module__", "")]
    sys.path_importer_cache.clear()
    for name in ("core", "kernels"):
        try:
            __import__(name)
        except ImportError:
            pass
        else:
            raise SystemExit(f"the project is importable here: {name}")
    import torch
    from transformers import AutoModelForCausalLM

    folder, inputs, out = sys.argv[1:4]
    model, info = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True, dtype=torch.float32,
                                                       output_loading_info=True)
    model.eval()
    ids = torch.tensor(json.loads(inputs))
    with torch.no_grad():
        logits = model(input_ids=ids, use_cache=False).logits
        generated = model.generate(input_ids=ids[:1], attention_mask=torch.ones_like(ids[:1]), do_sample=False,
                                   max_new_tokens=%d, min_new_tokens=%d, pad_token_id=0)
    project = sorted(m for m in sys.modules if m.split(".")[0] in ("core", "kernels"))
    torch.save({"logits": logits, "generated": generated}, out)
    print(json.dumps({"missing": sorted(info["missing_keys"]), "unexpected": sorted(info["unexpected_keys"]),
                      "mismatched": sorted(map(str, info["mismatched_keys"])), "class": type(model).__name__,
                      "module": type(model).__module__, "project_modules": project}))
''' % (NEW_TOKENS, NEW_TOKENS))


def plain_load(out, cwd):
    """What the plain-transformers load of export ``out`` in a clean subprocess reports and computes."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSTARTUP")}
    env.update(HF_MODULES_CACHE=str(cwd / "modules"), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    (cwd / "load.py").write_text(PLAIN_LOAD)
    result = subprocess.run([sys.executable, "load.py", str(out), json.dumps(IDS.tolist()), str(cwd / "out.pt")],
                            cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout.strip().splitlines()[-1]), torch.load(cwd / "out.pt")


@pytest.fixture(scope="module")
def gemma_exported(export_workspace):
    """``(run folder, report, export folder)`` of a tiny-test conversion of a tiny random Gemma 3
    (its own sliding-window and global layers, q/k norms) with the bundled tokenizer, 2 sink tokens,
    the power history normalisation and key feature maps per key/value head."""
    from transformers import AutoTokenizer, Gemma3ForCausalLM, Gemma3TextConfig

    from core.models import bundled_model_dir

    folder = export_workspace / "tiny-gemma3"
    tokenizer = AutoTokenizer.from_pretrained(bundled_model_dir(export_workspace))
    config = Gemma3TextConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=24, sliding_window=24,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"], max_position_embeddings=2048,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=0,
    )
    torch.manual_seed(0)
    Gemma3ForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    run = export_workspace / "runs" / "tiny-gemma3"
    # with sink tokens, the power history normalisation, key maps per key/value head (a state per
    # key/value head, window keys rotated back per layer type) and the history gate, so the carried
    # code is checked on them too
    config = preset("tiny-test", model={"source": str(folder)},
                    attention={"sink_tokens": 2, "history_norm": "power", "key_map_heads": "kv",
                               "history_gate": "query"})
    report = run_convert(config, run, workspace=export_workspace)
    return run, report, export(run, export_workspace / "export-gemma3", workspace=export_workspace)


@pytest.fixture(scope="module", params=["llama", "gemma3"])
def exported_any(request):
    """The tiny-test export of each architecture family the export is checked on."""
    return request.getfixturevalue("exported" if request.param == "llama" else "gemma_exported")


@pytest.fixture(scope="module")
def plain(exported_any, tmp_path_factory):
    return plain_load(exported_any[2], tmp_path_factory.mktemp("plain"))


def test_config_points_at_the_carried_modeling_code(exported):
    _, _, out = exported
    config = json.loads((out / "config.json").read_text())
    assert config["auto_map"] == {"AutoModelForCausalLM": f"modeling_lolcats.{MODEL_CLASS}"}
    assert config["architectures"] == [MODEL_CLASS] and config["lolcats"]["kind"] == "terraced"
    assert (out / MODELING_FILE).read_text() == modeling_source("LlamaForCausalLM")


def test_modeling_file_depends_only_on_torch_and_transformers(exported):
    _, _, out = exported
    tree = ast.parse((out / MODELING_FILE).read_text())
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            roots.add(node.module.split(".")[0])
    assert roots - set(sys.stdlib_module_names) <= {"torch", "transformers"}, roots


def test_gemma_export_carries_gemma_modeling_code(gemma_exported):
    _, report, out = gemma_exported
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "gemma3_text" and config["auto_map"]["AutoModelForCausalLM"].endswith(MODEL_CLASS)
    assert (out / MODELING_FILE).read_text() == modeling_source("Gemma3ForCausalLM")
    assert report["student_ppl"] > 0 and report["teacher_ppl"] > 0


def test_plain_transformers_rebuilds_the_model_with_every_key(plain):
    info, _ = plain
    assert info["missing"] == [] and info["unexpected"] == [] and info["mismatched"] == []
    assert info["class"] == MODEL_CLASS and info["module"].startswith("transformers_modules.")
    assert info["project_modules"] == []


def test_plain_transformers_matches_the_project_loader(plain, exported_any, export_workspace):
    _, got = plain
    _, _, out = exported_any
    model, _, _ = load_converted(out, device="cpu", workspace=export_workspace)
    with torch.no_grad():
        ref = model(input_ids=IDS, use_cache=False).logits
        generated = model.generate(input_ids=IDS[:1], attention_mask=torch.ones_like(IDS[:1]), do_sample=False,
                                   max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, pad_token_id=0)
    assert (got["logits"] - ref).abs().max().item() <= 1e-5 * ref.abs().max().item()
    assert torch.equal(got["generated"], generated) and generated.shape[1] == IDS.shape[1] + NEW_TOKENS
