"""The teacher of an exported model is its base model, not the merged weights with softmax attention."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from core.config import preset
from core.eval.metrics import perplexity, teacher_context
from core.export.teacher import TeacherUnavailableError, teacher_problem
from core.pipeline.convert import eval_text_blocks
from core.models import load_model
from core.load import load_converted
from core.run_folder import EXPORT_CONFIG
from tests.tiny_runs import last_logits, merged_weights_with_softmax

runner = CliRunner()


@pytest.fixture
def workspace(export_workspace):
    return export_workspace


def test_export_names_its_base_model(exported):
    _, _, out = exported
    meta = json.loads((out / EXPORT_CONFIG).read_text())
    assert meta["base_model"] == {"source": "tiny-random-llama", "dtype": "float32", "trust_remote_code": False,
                                  "revision": None}
    assert meta["config"]["model"]["source"] == "tiny-random-llama"


def test_eval_of_an_export_reports_the_runs_teacher_perplexity(cli, exported, workspace, tmp_path):
    _, report, out = exported
    config = preset("tiny-test")
    result = runner.invoke(cli, ["eval", str(out), "--blocks", str(config.eval.ppl_blocks), "--seq-len",
                                    str(config.data.seq_len), "--passkey-trials", "0", "-o", str(tmp_path / "e.json"),
                                    "--workspace", str(workspace)])
    assert result.exit_code == 0, result.output
    assert "teacher unavailable" not in result.output
    got = json.loads((tmp_path / "e.json").read_text())
    assert got["teacher_ppl"] == pytest.approx(report["teacher_ppl"], rel=1e-4)
    assert got["student_ppl"] == pytest.approx(report["student_ppl"], rel=1e-4)

    # the merged weights with softmax attention are another model: the swap is what makes it right
    model, tokenizer, _ = load_converted(out, device="cpu", workspace=workspace)
    blocks = eval_text_blocks(config, tokenizer)
    merged_teacher = merged_weights_with_softmax(model, lambda m: perplexity(m, blocks))
    assert merged_teacher != pytest.approx(report["teacher_ppl"], rel=1e-4)
    with teacher_context(model):
        assert perplexity(model, blocks) == pytest.approx(report["teacher_ppl"], rel=1e-4)
    assert perplexity(model, blocks) == pytest.approx(report["student_ppl"], rel=1e-4)  # the export's own weights back


def test_chat_on_an_export_answers_as_its_base_model(cli, exported, workspace, monkeypatch):
    """``lolcats chat EXPORT``: the teacher answers with the base model (not the merged weights with
    softmax attention), the student with the export's weights."""
    import core.eval.metrics as metrics

    _, _, out = exported
    seen, generate_text = [], metrics.generate_text

    def recording(model, tokenizer, prompt, max_new_tokens):
        seen.append((prompt, last_logits(model, tokenizer, prompt)))
        return generate_text(model, tokenizer, prompt, max_new_tokens)

    monkeypatch.setattr(metrics, "generate_text", recording)
    result = runner.invoke(cli, ["chat", str(out), "--max-new-tokens", "2", "--workspace", str(workspace)],
                           input="What is two plus two?\n\n")
    assert result.exit_code == 0, result.output
    (prompt, teacher), (student_prompt, student) = seen
    assert student_prompt == prompt
    base = json.loads((out / EXPORT_CONFIG).read_text())["base_model"]
    base_model, base_tokenizer = load_model(base["source"], dtype=base["dtype"], device="cpu", workspace=workspace)
    torch.testing.assert_close(teacher, last_logits(base_model, base_tokenizer, prompt), rtol=1e-5, atol=1e-5)
    model, tokenizer, _ = load_converted(out, device="cpu", workspace=workspace)
    torch.testing.assert_close(student, last_logits(model, tokenizer, prompt), rtol=1e-5, atol=1e-5)
    wrong = merged_weights_with_softmax(model, lambda m: last_logits(m, tokenizer, prompt))
    assert (wrong - teacher).abs().max() > 1e-3  # the wrong teacher would show


def _copy_with_meta(out, copy, edit) -> None:
    """A copy of the export ``out`` at ``copy`` whose ``lolcats.json`` ``edit`` (a function of the dict) changed."""
    copy.mkdir()
    for file in out.iterdir():
        (copy / file.name).write_bytes(file.read_bytes())
    meta = json.loads((copy / EXPORT_CONFIG).read_text())
    edit(meta)
    (copy / EXPORT_CONFIG).write_text(json.dumps(meta))


def test_missing_base_model_says_the_teacher_is_unavailable(cli, exported, workspace, tmp_path):
    _, _, out = exported
    moved = tmp_path / "moved"
    _copy_with_meta(out, moved, lambda meta: meta["base_model"].update(source=str(tmp_path / "gone")))

    model, _, _ = load_converted(moved, device="cpu", workspace=workspace)
    problem = teacher_problem(model)
    assert problem and "could not be loaded" in problem and str(tmp_path / "gone") in problem
    before = {n: p.clone() for n, p in model.named_parameters()}
    with pytest.raises(TeacherUnavailableError, match="could not be loaded"), teacher_context(model):
        pass
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())  # nothing changed

    result = runner.invoke(cli, ["eval", str(moved), "--blocks", "2", "--seq-len", "64", "--passkey-trials", "0",
                                    "--workspace", str(workspace)])
    assert result.exit_code == 0, result.output
    assert "teacher unavailable" in result.output and "could not be loaded" in " ".join(result.output.split())
    saved = json.loads((moved / "eval.json").read_text())
    assert saved["teacher_ppl"] is None and saved["ppl_ratio"] is None and saved["student_ppl"] > 0
    assert "could not be loaded" in saved["teacher_unavailable"]

    chat = runner.invoke(cli, ["chat", str(moved), "--max-new-tokens", "2", "--workspace", str(workspace)],
                         input="hello\n\n")
    assert chat.exit_code == 0, chat.output
    assert "teacher unavailable" in chat.output and "teacher (" not in chat.output and "student (" in chat.output


def test_an_export_written_before_the_attention_key_loads_the_same(exported, workspace, tmp_path):
    """``lolcats.json`` named the attention spec ``linearize`` before it took the config's name."""
    _, _, out = exported
    old = tmp_path / "old"
    _copy_with_meta(out, old, lambda meta: meta.update(linearize=meta.pop("attention")))
    now, tokenizer, _ = load_converted(out, device="cpu", workspace=workspace)
    before, _, _ = load_converted(old, device="cpu", workspace=workspace)
    assert before.attention_spec == now.attention_spec
    prompt = "The cat sat on the mat"
    torch.testing.assert_close(last_logits(before, tokenizer, prompt), last_logits(now, tokenizer, prompt),
                               rtol=0, atol=0)
