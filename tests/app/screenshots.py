"""Retake the README's images in headless Chromium with ``lolcats app`` on a workspace: with
``--chat``, the Chat page on the conversion it opens on (a finished one in the workspace, e.g. the
run folder of ``benchmarks/cpu_demo.py --workspace WS --run-dir WS/runs/smollm2-demo``), one message
answered by teacher and student, becomes ``docs/screenshot.png``; then a cpu-demo conversion of the
bundled SmolLM2 is queued, the Jobs page once stage 1 has run some steps (its overall bar and the
time left over the stage's) becomes ``docs/screenshot-jobs.png``, and the job is cancelled.

    .venv/bin/python -m tests.app.screenshots [--workspace WS] [--steps 12] [--chat] [--no-jobs]

A workspace that already holds the bundled model (``models/``) saves dequantising it again.
"""

from __future__ import annotations

import argparse
import re
import shutil
import tempfile
import time
from pathlib import Path

from core.config import preset
from jobs import api
from tests.app.browser_steps import send_chat
from tests.app.serving import PROJECT_ROOT, AppProcess
from tests.app.test_browser_e2e import CHROMIUM, CHROMIUM_ARGS, VIEWPORT, _goto, _shot

JOBS_IMAGE = PROJECT_ROOT / "docs" / "screenshot-jobs.png"
CHAT_IMAGE = PROJECT_ROOT / "docs" / "screenshot.png"
PROMPT = "Give me three tips for staying focused while studying."
CHAT_HEIGHT = 1150  # the page with two answers of 64 tokens, title to input box


def shoot_jobs(page, steps: int) -> None:
    """The Jobs page once stage 1 has run ``steps`` steps."""
    _goto(page, "Jobs")
    label = page.get_by_text(re.compile(r"stage 1: attention transfer: step \d+/\d+ · about .* left"))
    while int(re.search(r"step (\d+)/", label.first.inner_text()).group(1)) < steps:
        time.sleep(1)
    shutil.copy(_shot(page, "jobs-page"), JOBS_IMAGE)
    print(f"wrote {JOBS_IMAGE}")


def shoot_chat(page) -> None:
    """The Chat page on the conversion it opens on, :data:`PROMPT` answered by both models."""
    _goto(page, "Chat")
    send_chat(page, PROMPT, timeout_ms=600_000)
    # the chat scrolls its pane to the answers; a taller viewport, scrolled back up, shows the title too
    page.set_viewport_size({**VIEWPORT, "height": CHAT_HEIGHT})
    page.evaluate("() => document.querySelectorAll('*').forEach(e => { e.scrollTop = 0; })")
    page.wait_for_timeout(500)
    page.screenshot(path=str(CHAT_IMAGE))
    page.set_viewport_size(VIEWPORT)
    print(f"wrote {CHAT_IMAGE}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workspace", type=Path, help="workspace to run in (default: a fresh temporary one)")
    parser.add_argument("--steps", type=int, default=12, help="stage-1 steps to wait for before the Jobs image")
    parser.add_argument("--chat", action="store_true", help="retake the Chat image first (needs a finished conversion)")
    parser.add_argument("--no-jobs", action="store_true", help="leave the Jobs image as it is")
    args = parser.parse_args(argv)
    from playwright.sync_api import sync_playwright

    ws = args.workspace or Path(tempfile.mkdtemp(prefix="screenshot-ws-"))
    app = AppProcess(ws)
    job_id = None
    try:
        app.wait_ready()
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
            page = browser.new_page(viewport=VIEWPORT)
            page.set_default_timeout(600_000)
            page.goto(app.url)
            if args.chat:
                shoot_chat(page)
            if args.no_jobs:
                return 0
            job_id = api.submit_job("convert", preset("cpu-demo").model_dump(), name="demo", workspace=ws).id
            shoot_jobs(page, args.steps)
            browser.close()
    finally:
        if job_id is not None:
            api.cancel_job(job_id, workspace=ws)
        app.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
