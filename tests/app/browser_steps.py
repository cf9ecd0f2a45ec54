"""Steps on the app's pages in headless Chromium that the browser test (:mod:`tests.app.test_browser_e2e`)
and the README's images (:mod:`tests.app.screenshots`) share; ``page`` is a Playwright page of ``lolcats app``."""

from __future__ import annotations

# true once the Chat page shows both answers: each ends with its "N tokens in S s · R tok/s" line
BOTH_ANSWERED = "() => document.body.innerText.split('tok/s').length - 1 >= 2"


def send_chat(page, prompt: str, timeout_ms: float) -> None:
    """On the Chat page: type ``prompt``, send it, and wait up to ``timeout_ms`` until the teacher
    and the student have both answered."""
    box = page.get_by_test_id("stChatInputTextArea")
    box.wait_for()
    box.fill(prompt)
    box.press("Enter")
    page.wait_for_function(BOTH_ANSWERED, timeout=timeout_ms)
