"""The chat page in a real headless browser (Debian's chromium, driven by Playwright)."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
from serverproc import ROOT, ServerProcess

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ARTIFACTS = ROOT / "test-artifacts"
# As root, chromium needs --no-sandbox; the rest keeps it off this machine's closed network.
ARGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--disable-dev-shm-usage"]

pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (scripts/test installs it as root)")


@pytest.fixture()
def page(tmp_path: Path):  # type: ignore[no-untyped-def]
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        context = browser.new_context(viewport={"width": 1000, "height": 700})
        pg = context.new_page()
        yield pg
        context.close()
        browser.close()


def test_chat_page_streams_and_stops(page, server: ServerProcess) -> None:  # type: ignore[no-untyped-def]
    page.goto(f"{server.base_url}/")
    page.wait_for_function("document.querySelectorAll('#model option').length > 0")
    assert page.input_value("#model") == "smollm2-135m-instruct"
    page.fill("#prompt", "Write one sentence about the sea.")
    page.click("#send")
    answer = page.locator(".msg.assistant").last
    page.wait_for_function(  # streamed text appears
        "document.querySelector('.msg.assistant') && "
        "document.querySelector('.msg.assistant').textContent.length > 10", timeout=60_000)
    page.wait_for_selector(".msg.assistant .stats", timeout=60_000)  # the reply finished
    assert "tokens/s" in answer.locator(".stats").inner_text()
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "chat-page.png"))

    # A long generation, stopped from the page: the stream ends and the slot is freed.
    page.click("summary")
    page.fill("#max_tokens", "3000")
    page.fill("#prompt", "Tell me a very long story.")
    page.click("#send")
    page.wait_for_function("!document.querySelector('#stop').disabled")
    page.wait_for_function("document.querySelectorAll('.msg.assistant')[1] && "
                           "document.querySelectorAll('.msg.assistant')[1].textContent.length > 5",
                           timeout=60_000)
    page.click("#stop")
    page.wait_for_function("document.querySelector('#stop').disabled", timeout=10_000)
    assert "stopped" in page.locator(".msg.assistant").nth(1).inner_text()
    deadline = time.monotonic() + 10
    while server.engine_stats()["slots_busy"] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert server.engine_stats()["slots_busy"] == 0


def test_chat_page_lists_models_once_the_key_is_entered(page, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """On a server with keys the page's first listing is a 401; entering the key in the
    page lists the models then (it used to wait for a reload)."""
    from serverproc import start_server, stop_server

    keyfile = tmp_path / "keys"
    keyfile.write_text("sk-page\n")
    srv = start_server(tmp_path, "--api-key-file", str(keyfile), "--slots", "1",
                       "--threads", "1")
    try:
        page.goto(f"{srv.base_url}/")
        page.wait_for_function("document.querySelector('#error').textContent.includes('401')")
        assert "API key" in page.inner_text("#error")
        page.click("summary")  # the settings, where the key goes
        page.fill("#apikey", "sk-page")
        page.dispatch_event("#apikey", "change")
        page.wait_for_function("document.querySelectorAll('#model option').length > 0")
        assert page.input_value("#model") == "smollm2-135m-instruct"
        assert page.inner_text("#error") == ""
    finally:
        stop_server(srv)
