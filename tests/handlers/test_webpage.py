"""The web page in headless Chromium (Debian's package, driven by Playwright): type text, press Speak,
audio plays while it streams; upload a voice; download. Keeps a screenshot in artifacts/webpage.png."""

from __future__ import annotations

import io
import shutil

import numpy as np
import pytest
import soundfile as sf
from conftest import ROOT
from test_http import start_server, stop, wait_ready

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
playwright = pytest.importorskip("playwright.sync_api", reason="playwright is installed by .ci/run")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is installed by .ci/run")
ARTIFACTS = ROOT / "artifacts"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    proc, url = start_server(tmp_path_factory.mktemp("web"), TTS_DEFAULT_MAX_NEW_TOKENS="60")
    wait_ready(url, proc)
    yield url
    stop(proc)


@pytest.fixture(scope="module")
def page():
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=[
            "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--autoplay-policy=no-user-gesture-required"])
        yield browser.new_page(accept_downloads=True)
        browser.close()


def test_type_speak_and_hear_it_stream(server, page, tmp_path):
    page.goto(server + "/")
    page.fill("#text", "Hello from the browser. This sentence streams while it is spoken.")
    page.fill("#seed", "5")
    page.click("#speak")
    page.wait_for_function("document.body.dataset.state === 'playing'", timeout=60_000)
    playing = page.evaluate("({...window.ttsStats})")
    page.wait_for_function("document.body.dataset.state === 'done'", timeout=120_000)
    stats = page.evaluate("({...window.ttsStats})")
    # the page was playing before all audio had arrived, and the audio clock moved
    assert playing["scheduledSeconds"] < stats["scheduledSeconds"]
    assert stats["chunks"] > 1 and stats["error"] is None
    assert abs(stats["scheduledSeconds"] - 59 * 2048 / 44100) < 0.01
    page.wait_for_timeout(500)
    assert page.evaluate("ctx.currentTime") > 0.3
    assert "done:" in page.inner_text("#status")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "webpage.png"), full_page=True)
    assert (ARTIFACTS / "webpage.png").stat().st_size > 5000

    page.select_option("#format", "mp3")
    with page.expect_download(timeout=120_000) as info:
        page.click("#download")
    saved = tmp_path / "speech.mp3"
    info.value.save_as(saved)
    assert info.value.suggested_filename == "speech.mp3" and saved.stat().st_size > 1000


def test_upload_a_voice_and_use_it(server, page, tmp_path):
    ref = tmp_path / "me.wav"
    buf = io.BytesIO()
    sf.write(buf, (0.2 * np.random.default_rng(1).standard_normal(20000)).astype(np.float32), 22050, format="WAV")
    ref.write_bytes(buf.getvalue())
    page.goto(server + "/")
    page.fill("#vid", "browser-voice")
    page.fill("#vtext", "some noise")
    page.set_input_files("#vfile", str(ref))
    page.click("#upload")
    page.wait_for_function("document.getElementById('voice').value === 'browser-voice'", timeout=60_000)
    page.fill("#text", "Now in the uploaded voice.")
    page.click("#speak")
    page.wait_for_function("['done', 'error'].includes(document.body.dataset.state)", timeout=120_000)
    assert page.evaluate("document.body.dataset.state") == "done"


def test_errors_are_shown(server, page):
    page.goto(server + "/")
    page.fill("#text", "x")
    page.fill("#seed", "-1")  # negative seeds are fine; an empty text is not
    page.fill("#text", "")
    page.click("#speak")
    assert "type some text" in page.inner_text("#status")
