"""The export's model card and ``lolcats export --push-to-hub`` (against a mocked Hub client)."""

from __future__ import annotations

import json

import huggingface_hub
import pytest
import typer
from typer.testing import CliRunner

from core.cli import register
from core.config import preset
from core.export.card import CARD_FILE, base_model_license, model_card, training_tokens
from tests.long_context_report import FORMER_PASSKEY, MATCHED_LABEL, WINDOW_LABEL, long_context_section

runner = CliRunner()


def test_card_describes_the_conversion_and_its_numbers(exported):
    _, report, out = exported
    card = (out / CARD_FILE).read_text()
    assert card.startswith("---\nlibrary_name: transformers\n")
    assert "Base model: `tiny-random-llama`" in card and "license: unknown" in card
    assert f"| held-out perplexity | {report['teacher_ppl']:.3f} | {report['student_ppl']:.3f} |" in card
    assert f"| ratio (student / teacher) | | {report['ppl_ratio']:.3f} |" in card
    assert "| passkey accuracy |" in card
    mse = [v for v in report["per_layer_mse"]]
    assert f"2 converted layers: mean {sum(mse) / 2:.3g}" in card and f"max {max(mse):.3g}" in card
    tokens = training_tokens(preset("tiny-test"))
    assert tokens == {"stage1": 4 * 64, "stage2": 4 * 64}
    assert f"stage1 {tokens['stage1']:,}, stage2 {tokens['stage2']:,} ({sum(tokens.values()):,} in all)" in card
    assert f"total {report['timings']['total_s']:.1f} s" in card
    assert 'AutoModelForCausalLM.from_pretrained("export", trust_remote_code=True)' in card
    assert "## Limits" in card and "| attention kind | terraced (window 16, 0 sink tokens) |" in card
    assert "| history | decay, gate none, key feature maps per query head, on q and k before RoPE |" in card
    for row in report["long_context"]["by_length"]:  # the tiny-test preset evaluates 64 and 256 tokens
        assert f"| {row['length']} | {row['teacher_ppl']:.3f} | {row['student']['ratio']:.3f} | " in card


def _card(run_dir, long_context, **fields) -> str:
    """The card of a tiny-test run folder whose report holds ``long_context`` (no key when "absent")
    and any other ``fields``."""
    config = preset("tiny-test")
    run_dir.mkdir()
    (run_dir / "config.json").write_text(config.model_dump_json())
    report = {"teacher_ppl": 7.0, "student_ppl": 7.5, "ppl_ratio": 7.5 / 7.0, "per_layer_mse": [0.1, 0.2], **fields}
    if long_context != "absent":
        report["long_context"] = long_context
    (run_dir / "report.json").write_text(json.dumps(report))
    spec = {**config.attention.model_dump(), "softmax_layers": []}
    return model_card(run_dir, {"source": "tiny-random-llama", "dtype": "float32"}, spec, "export")


def test_card_has_quality_by_context_length_and_the_verdicts(tmp_path):
    card = _card(tmp_path / "run", long_context_section())
    assert "| passkey accuracy | 96% | 62% |" in card  # over the grid: 5.75 and 3.75 of 6 cells
    part = card[card.index("## Quality by context length"):card.index("## Loading")]
    assert "on kjv-sample, 2 held-out sequence(s); trained on 512-token blocks" in part
    table = [line for line in part.split("###")[0].splitlines() if line.startswith("| ")]
    assert table == [f"| length | teacher ppl | student | {WINDOW_LABEL} | {MATCHED_LABEL} | top-1 agreement |",
                     "| --- | --- | --- | --- | --- | --- |",
                     "| 256 | 7.100 | 1.001 | 1.180 | 1.010 | 89% |",
                     "| 1024 | 6.500 | 1.050 | 1.300 | 1.040 | 86% |",
                     "| 4096 | 6.000 | 1.180 | 1.450 | 1.020 | 80% |"]
    assert f"- the student is better than the untrained {WINDOW_LABEL} at every length\n" in part
    assert f"- **the student is worse than the untrained {MATCHED_LABEL} at 4096 tokens**\n" in part
    assert f"- the student is level with the untrained {MATCHED_LABEL} at 256, 1024 tokens\n" in part
    assert "- A difference within twice its standard error on these sequences is called level.\n" in part
    frontier = part[part.index("### Against the training-free frontier"):]
    assert "the student holds 502,272 bytes per layer" in frontier
    assert ("| length | student (490 KiB) | window 32 + 4 (54 KiB) | window 128 + 4 (198 KiB) | "
            "window 323 + 4 (490 KiB) | window 512 + 4 (774 KiB) | curve at the student's bytes | verdict | "
            "window bytes for the student's quality |") in frontier
    # at 4096 the curve reaches the student's 1.18 between 128 and 323 keys (1.30 and 1.02 there)
    assert "| 4096 | 1.180 | 1.600 | 1.300 | 1.020 | 1.010 | 1.020 | worse | 291,253 |" in frontier
    assert "| 256 | 1.001 | 1.100 | 1.030 | 1.010 | 1.000 | 1.010 | level | 750,178 |" in frontier


def test_card_of_a_report_written_before_the_verdicts_were_data(tmp_path):
    card = _card(tmp_path / "run", long_context_section(older=True))
    part = card[card.index("## Quality by context length"):card.index("## Loading")]
    assert "| 4096 | 6.000 | 1.180 | 1.450 | 1.020 | 80% |" in part
    assert f"- **the student is worse than the untrained {MATCHED_LABEL} at 1024, 4096 tokens**\n" in part
    assert "frontier" not in part and "WORSE" not in part
    assert "- A difference within 0.5% of perplexity is called level (this evaluation predates" in part


def test_card_of_a_report_with_the_passkey_section_of_its_own(tmp_path):
    """A report written when the evaluation measured a short passkey grid of its own beside the long-context one."""
    card = _card(tmp_path / "run", long_context_section(older=True) | {"passkey": None}, passkey=FORMER_PASSKEY)
    assert "| passkey accuracy | 100% | 50% |" in card
    assert "| 4096 | 6.000 | 1.180 | 1.450 | 1.020 | 80% |" in card


@pytest.mark.parametrize("long_context", ["absent", None], ids=["older-report", "nothing-converted"])
def test_card_without_long_context_has_no_such_part(tmp_path, long_context):
    card = _card(tmp_path / "run", long_context)
    assert "| held-out perplexity | 7.000 | 7.500 |" in card
    assert "Quality by context length" not in card


def test_base_model_license_when_known(tmp_path):
    assert base_model_license("smollm2-135m-instruct") == "apache-2.0"
    assert base_model_license("tiny-random-llama") is None
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "README.md").write_text("---\nlanguage: en\nlicense: llama3.1\n---\n# A model\n")
    assert base_model_license(str(tmp_path)) == "llama3.1"
    (tmp_path / "README.md").write_text("# no front matter\nlicense: mit\n")
    assert base_model_license(str(tmp_path)) is None


def test_push_to_hub_uploads_the_exported_folder(exported, export_workspace, tmp_path, monkeypatch):
    calls = []

    class FakeApi:
        def create_repo(self, repo_id, **kwargs):
            calls.append(("create_repo", repo_id, kwargs))

        def upload_folder(self, **kwargs):
            calls.append(("upload_folder", kwargs))
            return "https://huggingface.co/me/tiny-lolcats/commit/abc"

    monkeypatch.setattr(huggingface_hub, "HfApi", FakeApi)
    run, _, _ = exported
    app = typer.Typer()
    register(app)
    out = tmp_path / "pushed"
    result = runner.invoke(app, ["export", str(run), str(out), "--push-to-hub", "me/tiny-lolcats", "--private",
                                 "--workspace", str(export_workspace)])
    assert result.exit_code == 0, result.output
    assert calls[0] == ("create_repo", "me/tiny-lolcats", {"private": True, "exist_ok": True})
    assert calls[1][1]["repo_id"] == "me/tiny-lolcats" and calls[1][1]["folder_path"] == str(out)
    assert "commit/abc" in result.output and json.loads((out / "lolcats.json").read_text())["base_model"]
