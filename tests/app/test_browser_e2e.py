"""End to end in headless Chromium: ``lolcats app`` on a free port, launch a ``tiny-test`` conversion
from the Launch page, watch it succeed on the Jobs page, open Layers and Attention, chat with both
models, export it from the Jobs page, start a new conversion from its config (a missing data file
refused), and open a run folder made outside the workbench on the Attention page; and a longer
conversion's overall bar, cancelled and resumed from the Jobs page, its time left after the resume
following the resumed attempt's pace. Screenshots go to ``$LOLCATS_ARTIFACTS_DIR`` (default
``tmp/artifacts/e2e`` in the project). The README's images come from :mod:`tests.app.screenshots`
(a conversion of the bundled SmolLM2, which answers in words)."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from jobs import api
from tests.app.browser_steps import send_chat
from tests.app.serving import PROJECT_ROOT, AppProcess

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
VIEWPORT = {"width": 1500, "height": 1000}
ARTIFACTS = Path(os.environ.get("LOLCATS_ARTIFACTS_DIR") or PROJECT_ROOT / "tmp" / "artifacts") / "e2e"
CONVERSION_TIMEOUT_S = 150

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium "
                                                     "(apt-get install -y chromium chromium-driver)"),
]


@pytest.fixture
def workspace(tmp_path, seeded):
    """A fresh workspace whose model cache already holds the tiny model (built by the seeding)."""
    ws = tmp_path / "ws"
    shutil.copytree(seeded.workspace / "models" / "tiny-random-llama", ws / "models" / "tiny-random-llama")
    return ws


@pytest.fixture
def running_app(workspace):
    app = AppProcess(workspace)
    try:
        app.wait_ready()
        yield app
    finally:
        code = app.stop(signal.SIGTERM)
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        shutil.copy(app.log, ARTIFACTS / "app.log")
        assert code == 0, app.output()[-3000:]


@pytest.fixture
def requests_made() -> list[str]:
    """The URL of every request the browser made for the page, in order."""
    return []


def _left_the_machine(urls: list[str]) -> list[str]:
    """The requests to anywhere but this machine (data: and blob: URLs are no requests)."""
    return [u for u in urls if urlsplit(u).scheme not in ("data", "blob")
            and urlsplit(u).hostname not in ("127.0.0.1", "localhost")]


@pytest.fixture
def page(running_app, request, requests_made):
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    console: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            pg = browser.new_page(viewport=VIEWPORT)
            pg.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
            pg.on("request", lambda r: requests_made.append(r.url))
            pg.set_default_timeout(60_000)
            yield pg
        finally:  # what the page showed last: the first thing to read when a step timed out
            (ARTIFACTS / "console.log").write_text("\n".join(console))
            with contextlib.suppress(Exception):
                pg.screenshot(path=str(ARTIFACTS / f"last-page-{request.node.name}.png"), full_page=True, timeout=10_000)
            browser.close()


# the tallest of the panes that scroll (the main one, or the app view around it), at least the document's
MAIN_PANE_HEIGHT = ("() => Math.max(document.documentElement.scrollHeight, ...['stMain', 'stAppViewContainer']"
                    ".map(id => document.querySelector(`[data-testid=\"${id}\"]`)?.scrollHeight || 0))")


def _shot(page, name: str) -> Path:
    """A screenshot of the whole page: Streamlit scrolls inside its main pane, not the document, so
    the viewport grows to the pane's height for the shot (``full_page`` alone keeps the visible part)."""
    path = ARTIFACTS / f"{name}.png"
    page.wait_for_timeout(800)  # let plotly finish its transitions
    height = page.evaluate(MAIN_PANE_HEIGHT)
    page.set_viewport_size({**VIEWPORT, "height": max(VIEWPORT["height"], height)})
    page.wait_for_timeout(300)
    try:
        page.screenshot(path=str(path), full_page=True)
    finally:
        page.set_viewport_size(VIEWPORT)
    assert _png_height(path) >= height, (name, height)
    return path


def _png_height(path: Path) -> int:
    """The height in pixels of a PNG (its IHDR chunk, bytes 20-24)."""
    return int.from_bytes(path.read_bytes()[20:24], "big")


def _goto(page, title: str) -> None:
    page.get_by_test_id("stSidebarNav").get_by_role("link", name=title).click()
    page.get_by_role("heading", name=title).first.wait_for()


def _idle(page, timeout: float = 60_000) -> None:
    """Wait until Streamlit has finished the current script run."""
    page.wait_for_function("() => !document.querySelector('[data-testid=\"stStatusWidget\"]')", timeout=timeout)


def _select(page, label: str, option: str | re.Pattern) -> None:
    page.get_by_test_id("stSelectbox").filter(has_text=label).first.click()
    page.get_by_role("option", name=option, exact=True).click()
    _idle(page)


def test_launch_watch_inspect_and_chat(page, running_app, workspace, requests_made):
    url = running_app.url
    t0 = time.monotonic()
    page.goto(url)
    page.get_by_role("heading", name="Launch a conversion").wait_for()
    _idle(page, 120_000)

    # Launch: the tiny-test preset, then the launch button
    _select(page, "Preset", "tiny-test")
    page.get_by_text("The config is valid.").wait_for()
    page.get_by_test_id("stMarkdown").filter(has_text="model tiny-random-llama").first.wait_for()  # rerun done
    page.get_by_role("button", name="Launch conversion").click()
    page.get_by_text(re.compile(r"Queued conversion job #1\.")).wait_for()  # shown on the Jobs page
    _shot(page, "1-launch")
    job = api.list_jobs(workspace=workspace)[0]
    assert (job.kind, job.config["model"]["source"]) == ("convert", "tiny-random-llama")

    # Jobs: the job runs in the worker; a reload shows the same job; it reaches succeeded
    _goto(page, "Jobs")
    page.get_by_text(re.compile(r"Job #1 .*(queued|running|succeeded)")).first.wait_for()
    page.reload()
    page.get_by_text(re.compile(r"Job #1 .*(queued|running|succeeded)")).first.wait_for(timeout=60_000)
    page.get_by_text(re.compile(r"Job #1 .*succeeded")).first.wait_for(timeout=CONVERSION_TIMEOUT_S * 1000)
    assert api.get_job(job.id, workspace=workspace).status == "succeeded"
    _shot(page, "2-jobs")

    # Layers: per-layer curves and the final bars
    _goto(page, "Layers")
    page.get_by_text("Highest final MSE: layer").wait_for()
    page.locator(".js-plotly-plot").nth(1).wait_for()  # curves and final bars (plotly loads lazily)
    _shot(page, "3-layers")

    # Attention: three heatmaps of the converted layer
    _goto(page, "Attention")
    page.get_by_text("Mean |difference|").wait_for(timeout=120_000)
    page.locator(".js-plotly-plot").first.wait_for()
    _select(page, "Layer", re.compile(r"^layer 1( |$)"))  # "layer 1 (highest final MSE)" where it is
    page.get_by_test_id("stRadio").filter(has_text="Colour scale").get_by_text("log", exact=True).click()
    page.get_by_text("log10 weight").first.wait_for()  # the colour bar of the log scale
    _shot(page, "4-attention")

    # Chat: one message, both models answer
    _goto(page, "Chat")
    send_chat(page, "Hello! What can you do?", timeout_ms=120_000)
    assert page.get_by_text(re.compile(r"\d+ tokens in [\d.]+ s · [\d.]+ tok/s")).count() == 2
    page.get_by_text("Teacher · softmax attention").first.wait_for()
    page.get_by_text("Student · LoLCATs attention").first.wait_for()
    _shot(page, "5-chat")
    _export_and_reuse(page, workspace, job.id)
    _cli_run_on_the_attention_page(page, workspace, job.id)
    _cli_run_exported_from_the_jobs_page(page, workspace)
    for title in ("Evaluation", "Budgets", "Benchmark"):  # the pages not opened above
        _goto(page, title)
        _idle(page)
    assert requests_made and _left_the_machine(requests_made) == []  # the app works offline
    print(f"end-to-end flow in {time.monotonic() - t0:.0f} s; screenshots in {ARTIFACTS}")


def _export_and_reuse(page, workspace, job_id: int) -> None:
    """Jobs: export the finished conversion from the page (an export job the app's worker runs), then
    start a new conversion from its config; the Launch page refuses a data file that does not exist."""
    from playwright.sync_api import expect

    _goto(page, "Jobs")
    page.get_by_role("button", name="Export").click()
    export = None
    deadline = time.monotonic() + CONVERSION_TIMEOUT_S
    while export is None or export.status not in ("succeeded", "failed"):
        assert time.monotonic() < deadline, "the export job did not finish"
        time.sleep(0.5)
        export = next((j for j in api.list_jobs(kind="export", workspace=workspace)), None)
    assert export.status == "succeeded", export.error
    assert (workspace / "exports" / str(job_id) / "lolcats.json").is_file()
    page.get_by_role("link", name="New conversion from this job").click()
    page.get_by_role("heading", name="Launch a conversion").wait_for()
    page.get_by_text(f"job #{job_id}").first.wait_for()  # "Based on job #1 ...": the form holds its config
    _idle(page, 120_000)
    local_file = page.get_by_test_id("stRadio").filter(has_text="Training data").get_by_text(
        "Local json / jsonl / parquet / txt file")
    local_file.wait_for(timeout=120_000)  # the Launch page draws the whole form: slow on a loaded machine
    local_file.click()
    path = page.get_by_label("File path")
    path.wait_for(timeout=120_000)
    path.fill("/no/such/rows.jsonl")
    path.press("Enter")
    page.get_by_text(re.compile(r"'/no/such/rows\.jsonl' does not exist")).first.wait_for()
    expect(page.get_by_role("button", name="Launch conversion")).to_be_disabled()
    # the form still holds the job's config (a spurious preset change would have refilled it)
    teacher = page.get_by_test_id("stRadio").filter(has_text="Teacher model")
    expect(teacher.get_by_role("radio", name="Tiny random Llama")).to_be_checked()
    _shot(page, "6-relaunch-refused-data")


def _cli_run_on_the_attention_page(page, workspace, job_id: int) -> None:
    """A run folder made outside the workbench (here a copy, as `lolcats convert -o runs/cli-demo`
    leaves one) opens on the Attention page; a CJK + emoji prompt reads as text and bytes."""
    shutil.copytree(workspace / "runs" / str(job_id), workspace / "runs" / "cli-demo")
    _goto(page, "Attention")
    page.get_by_text("Mean |difference|").wait_for(timeout=120_000)
    page.get_by_test_id("stSelectbox").filter(has_text="Conversion").first.click()
    page.get_by_role("option").filter(has_text="runs/cli-demo (run)").click()
    _idle(page)
    prompt = page.get_by_role("textbox", name="Prompt")
    prompt.fill("猫は🐈 sat on the mat")
    prompt.press("Control+Enter")
    page.wait_for_function("() => document.body.innerHTML.includes('&lt;0xE7&gt;') "
                           "&& document.body.innerHTML.includes('␣sat')", timeout=120_000)
    _shot(page, "7-cli-run-attention")


def _cli_run_exported_from_the_jobs_page(page, workspace) -> None:
    """The run folder made outside the workbench is on the Jobs page with its origin; exported from
    there, its model card is titled and loaded by the export's own name."""
    _goto(page, "Jobs")
    page.get_by_role("heading", name="Run folders and exports").wait_for()
    page.locator("[data-testid=stDataFrame]").filter(has_text="run folder (lolcats convert, or copied in)").wait_for(
        state="attached")  # the table is drawn on a canvas: its cells are in the page but hidden
    _pick_on_the_jobs_page(page, "Folder", "runs/cli-demo (run)")
    page.locator(".st-key-folder_export_runs-cli-demo button").first.click()
    page.get_by_text(re.compile(r"Export job #\d+ is (queued|running), into exports/cli-demo")).first.wait_for()
    export = None
    deadline = time.monotonic() + CONVERSION_TIMEOUT_S
    while export is None or export.status not in ("succeeded", "failed"):
        assert time.monotonic() < deadline, "the export job did not finish"
        time.sleep(0.5)
        export = next((j for j in api.list_jobs(kind="export", workspace=workspace)
                       if j.config["run"] == "runs/cli-demo"), None)
    assert export.status == "succeeded", export.error
    _pick_on_the_jobs_page(page, "Job", f"#{export.id} · export")
    page.get_by_role("tab", name="Result").click()
    page.get_by_role("heading", name=re.compile(r"^cli-demo: LoLCATs conversion of")).wait_for()
    card = page.get_by_test_id("stExpander").filter(has_text="Model card (README.md)").first.inner_text()
    assert 'from_pretrained("cli-demo", trust_remote_code=True)' in card and ".partial" not in card
    assert "library_name: transformers" in card  # the front matter, shown as YAML
    _shot(page, "8-cli-run-export-card")


def _pick_on_the_jobs_page(page, label: str, option: str | re.Pattern) -> None:
    """Pick ``option`` in the select box ``label`` of the Jobs page, whose job list refreshes every
    2 s and may close an open list before the click: open it again until the pick holds."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    box = page.get_by_test_id("stSelectbox").filter(has_text=label).first
    for _ in range(10):
        box.click()
        with contextlib.suppress(PlaywrightTimeout):
            page.get_by_role("option").filter(has_text=option).first.click(timeout=1500)
            break
    _idle(page)
    # the pick shows as the box's text or as its combobox input's value, by Streamlit's version
    wanted = option if isinstance(option, re.Pattern) else re.compile(re.escape(option))
    deadline = time.monotonic() + 10
    while True:
        shown = box.inner_text() + " " + " ".join(box.get_by_role("combobox").evaluate_all("els => els.map(e => e.value || '')"))
        if wanted.search(shown) or time.monotonic() > deadline:
            break
        time.sleep(0.25)
    assert wanted.search(shown), f"{label}: {shown!r} does not show {option!r}"


def _seconds(text: str) -> float:
    """Seconds of a duration as the pages write it (``1h 02m``, ``3m 05s``, ``42s``)."""
    units = {"h": 3600, "m": 60, "s": 1}
    return float(sum(int(n) * units[u] for n, u in re.findall(r"(\d+)([hms])", text)))


def test_overall_progress_cancel_and_resume(page, running_app, workspace):
    """A running conversion shows one overall bar over its stage's; Cancel stops it at a step and
    Resume continues it there; the time left after the resume follows this attempt's pace."""
    from playwright.sync_api import expect

    from core.config import preset
    from app.progress import pace

    steps = 4000
    config = preset("tiny-test", stage1={"steps": steps, "eval_every": steps}).model_dump()
    job_id = api.submit_job("convert", config, name="long", workspace=workspace).id
    page.goto(running_app.url)
    _goto(page, "Jobs")
    page.get_by_text(re.compile(r"Overall \d+%")).first.wait_for(timeout=120_000)
    page.get_by_text(re.compile(rf"stage 1: attention transfer: step \d+/{steps}")).first.wait_for()
    _shot(page, "9-overall-progress")

    def running_past(step: int, attempt: int):
        info = api.get_job(job_id, workspace=workspace)
        return info if (info.status, info.attempt) == ("running", attempt) and (info.progress_step or 0) >= step else None

    deadline = time.monotonic() + CONVERSION_TIMEOUT_S
    while not running_past(20, 1):
        assert time.monotonic() < deadline, "stage 1 did not reach step 20"
        time.sleep(0.2)
    page.get_by_role("button", name="Cancel").click()
    while (info := api.get_job(job_id, workspace=workspace)).status != "cancelled":
        assert time.monotonic() < deadline, f"the cancel did not stop the job ({info.status})"
        time.sleep(0.2)
    stopped_at = info.progress_step
    assert 20 <= stopped_at < steps
    # while the page reruns, the running job's disabled Resume may still stand beside the new one
    resume = page.get_by_role("button", name="Resume", disabled=False).first
    expect(resume).to_be_visible(timeout=60_000)
    resume.click()
    while not running_past(stopped_at + 40, 2):
        assert time.monotonic() < deadline, "the resumed attempt did not reach 40 steps"
        time.sleep(0.2)

    # the stage's time left, read off the page, against this attempt's pace read from the database
    label = page.get_by_text(re.compile(r"stage 1: attention transfer: step \d+/\d+ · about .* left in this stage"))
    while int(re.search(r"step (\d+)/", text := label.first.inner_text(timeout=60_000)).group(1)) < stopped_at + 40:
        assert time.monotonic() < deadline, f"the page did not show the resumed steps ({text})"
        time.sleep(0.5)
    shown_step = int(re.search(r"step (\d+)/", text).group(1))
    shown = _seconds(re.search(r"about (.*) left in this stage", text).group(1))
    rows = [p for p in api.job_metrics(job_id, stage="stage1", workspace=workspace) if p.attempt == 2]
    per_step = pace([p for p in rows if p.step <= shown_step])[0]
    expected = (steps - shown_step) * per_step
    assert expected / 2 <= shown <= expected * 2, (text, expected)  # not the pace of all steps since the start
    _shot(page, "10-resumed")
    api.cancel_job(job_id, workspace=workspace)
