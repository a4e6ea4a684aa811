"""The web page in headless Chromium (Debian's package, driven by Playwright): type text, press Speak, audio
plays while it streams, then its first-audio time and real-time factor show; a new seed each time unless pinned;
Download saves what played; voices: upload, rename, delete; a phone's width; an API key. Keeps screenshots in
artifacts/webpage.png and artifacts/webpage-phone.png."""

from __future__ import annotations

import base64
import io
import shutil

import httpx
import numpy as np
import pytest
import soundfile as sf
from conftest import ROOT
from test_http import served, start_server, stop, wait_ready

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
playwright = pytest.importorskip("playwright.sync_api", reason="playwright is installed by .ci/run")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is installed by .ci/run")
ARTIFACTS = ROOT / "artifacts"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with served(tmp_path_factory.mktemp("web"), TTS_DEFAULT_MAX_NEW_TOKENS="60") as url:
        yield url


@pytest.fixture(scope="module")
def browser():
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=[
            "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--autoplay-policy=no-user-gesture-required"])
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def page(browser):
    page = browser.new_page(accept_downloads=True, bypass_csp=True)  # the CSP test below: the page; here: its use
    yield page
    page.close()


def noise_wav(path, seconds: float = 0.9):
    buf = io.BytesIO()
    sf.write(buf, (0.2 * np.random.default_rng(1).standard_normal(int(seconds * 22050))).astype(np.float32), 22050,
             format="WAV")
    path.write_bytes(buf.getvalue())
    return path


def speak(page, timeout: float = 120_000):
    """Presses Speak; -> (the request, the response) once the page says done."""
    with page.expect_response(lambda r: r.url.endswith("/v1/audio/speech"), timeout=timeout) as info:
        page.click("#speak")
    page.wait_for_function("['done', 'error', 'stopped'].includes(document.body.dataset.state)", timeout=timeout)
    assert page.evaluate("document.body.dataset.state") == "done", page.inner_text("#status")
    return info.value.request, info.value


def kept(page) -> bytes:
    """The WAV the page keeps for Download (Chromium keeps no body of a streamed fetch for Playwright to read)."""
    return base64.b64decode(page.evaluate("""async () => {
        const bytes = new Uint8Array(await wav.arrayBuffer());
        let text = "";
        for (const b of bytes) text += String.fromCharCode(b);
        return btoa(text);
    }"""))


def test_type_speak_and_hear_it_stream(server, page):
    urls = []
    page.on("request", lambda r: urls.append(r.url))
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
    assert urls and all(u.startswith(server + "/") for u in urls)  # one self-contained file: works offline


def test_first_audio_time_and_real_time_factor_are_shown(server, page):
    page.goto(server + "/")
    page.fill("#text", "How fast is this?")
    speak(page)
    stats = page.evaluate("({...window.ttsStats})")
    assert 0 < stats["firstChunkMs"] < stats["wallSeconds"] * 1000
    assert stats["rtf"] == pytest.approx(stats["scheduledSeconds"] / stats["wallSeconds"])
    shown = page.inner_text("#metrics")
    # the numbers as the page rounds them: JavaScript's toFixed and Python's format round some halves apart
    # (82.5 is "83" in JavaScript, "82" in Python), and Chromium's 0.1 ms timer steps make such values common
    fixed = page.evaluate("s => [s.firstChunkMs.toFixed(0), s.scheduledSeconds.toFixed(2), s.wallSeconds.toFixed(2),"
                          " s.rtf.toFixed(2)]", stats)
    assert f"first audio {fixed[0]} ms" in shown
    assert f"{fixed[1]} s of audio in {fixed[2]} s" in shown
    assert f"real-time factor {fixed[3]}" in shown


def test_a_new_seed_each_time_unless_pinned(server, page):
    page.goto(server + "/")
    page.fill("#text", "Seeds.")
    assert not page.is_checked("#pin")
    seeds = []
    for _ in range(2):
        request, response = speak(page)
        assert "seed" not in request.post_data_json  # the server picks one
        seeds.append(response.headers["x-seed"])
        assert page.input_value("#seed") == seeds[-1] and seeds[-1] in page.inner_text("#status")
    assert seeds[0] != seeds[1]

    page.check("#pin")  # keeps the seed just shown: Speak again gives that audio again
    request, response = speak(page)
    assert f'"seed":{seeds[1]}' in request.post_data and response.headers["x-seed"] == seeds[1]
    first = kept(page)
    request, response = speak(page)
    assert response.headers["x-seed"] == seeds[1] and kept(page) == first

    page.uncheck("#pin")
    page.fill("#seed", "18446744073709551615")  # typing a seed pins it
    assert page.is_checked("#pin")
    request, response = speak(page)
    assert '"seed":18446744073709551615}' in request.post_data  # as typed: past 2^53, a JS number would round it
    assert response.headers["x-seed"] == page.input_value("#seed") == "18446744073709551615"

    page.fill("#seed", "12x")
    page.click("#speak")
    assert "whole number" in page.inner_text("#status")
    page.fill("#seed", str(2**64))  # the server's range check, shown
    page.click("#speak")
    page.wait_for_function("document.body.dataset.state === 'error'", timeout=60_000)
    assert "64 bits" in page.inner_text("#status")


def test_download_saves_the_audio_just_played(server, page, tmp_path):
    posts = []
    page.on("request", lambda r: posts.append(r.url) if r.method == "POST" else None)
    page.goto(server + "/")
    assert page.is_disabled("#download")
    page.fill("#text", "Download what you heard.")
    # a pinned seed: with a server-drawn one, CI once got 6,688 bytes of speech here (not reproduced: 60 random
    # seeds gave long speech; noted in stop 56's closing note); this test is about the download, not the length
    page.fill("#seed", "1")
    page.check("#pin")
    request, response = speak(page)
    assert len(posts) == 1 and request.post_data_json["seed"] == 1
    with page.expect_download(timeout=30_000) as info:
        page.click("#download")
    saved = tmp_path / info.value.suggested_filename
    info.value.save_as(saved)
    assert posts == [server + "/v1/audio/speech"]  # no second generation
    assert info.value.suggested_filename == f"speech-seed{response.headers['x-seed']}.wav"
    data = saved.read_bytes()
    stats = page.evaluate("({...window.ttsStats})")
    assert len(data) == 44 + stats["bytes"] and stats["bytes"] > 10_000  # all the bytes received, as a WAV
    audio, rate = sf.read(saved, dtype="int16")
    assert rate == int(response.headers["x-sample-rate"]) == 24000 and len(audio) * 2 == stats["bytes"]
    assert len(audio) / rate == pytest.approx(stats["scheduledSeconds"])
    # and the same audio: the server makes it again from the seed the page showed
    again = httpx.post(server + "/v1/audio/speech", timeout=120, json={
        **request.post_data_json, "seed": int(response.headers["x-seed"])})
    assert data[44:] == again.content
    assert "saved speech-seed" in page.inner_text("#status")


def test_voices_upload_use_rename_delete(server, page, tmp_path):
    ref = noise_wav(tmp_path / "me.wav")
    page.goto(server + "/")
    assert page.is_visible("#novoices") and page.locator("#voices li").count() == 0
    page.fill("#vid", "browser-voice")
    page.fill("#vtext", "some noise")
    page.set_input_files("#vfile", ref)
    page.click("#upload")
    page.wait_for_function("document.getElementById('voice').value === 'browser-voice'", timeout=60_000)
    assert "voice 'browser-voice' added" in page.inner_text("#status")
    row = page.locator("#voices li")
    assert row.count() == 1 and "some noise" in row.inner_text() and not page.is_visible("#novoices")
    page.fill("#text", "Now in the uploaded voice.")
    request, _ = speak(page)
    assert request.post_data_json["voice"] == "browser-voice"
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "webpage.png"), full_page=True)
    assert (ARTIFACTS / "webpage.png").stat().st_size > 5000

    # the server's error messages are shown: a taken id, a bad name
    page.fill("#vid", "browser-voice")
    page.click("#upload")
    assert "give an id, an audio file and what it says" in page.inner_text("#status")
    page.fill("#vtext", "more noise")
    page.set_input_files("#vfile", ref)
    page.click("#upload")
    page.wait_for_function("document.getElementById('status').textContent.startsWith('upload:')", timeout=30_000)
    assert "upload: voice 'browser-voice' already exists" in page.inner_text("#status")
    page.fill("#voices li .name", "no/slashes")
    page.click("#voices li .rename")
    page.wait_for_function("document.getElementById('status').textContent.startsWith('rename:')")
    assert "invalid voice id" in page.inner_text("#status")

    page.fill("#voices li .name", "my voice")
    page.click("#voices li .rename")
    page.wait_for_function("document.getElementById('voice').value === 'my voice'")  # still the chosen one
    assert "renamed to 'my voice'" in page.inner_text("#status")
    assert page.get_attribute("#voices li", "data-id") == "my voice"

    page.once("dialog", lambda d: d.dismiss())  # asks first
    page.click("#voices li .delete")
    assert page.locator("#voices li").count() == 1
    page.once("dialog", lambda d: d.accept())
    page.click("#voices li .delete")
    page.wait_for_function("document.querySelectorAll('#voices li').length === 0")
    assert "voice 'my voice' deleted" in page.inner_text("#status")
    assert page.input_value("#voice") == "default" and page.is_visible("#novoices")


def test_fits_a_phone(server, browser, tmp_path):
    httpx.post(server + "/v1/references/add", data={"id": "a voice with a long name for a narrow screen",
                                                      "text": "a long transcript " * 20},
               files={"audio": ("a.wav", noise_wav(tmp_path / "a.wav").read_bytes())}).raise_for_status()
    page = browser.new_page(viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True, bypass_csp=True)
    try:
        page.goto(server + "/")
        page.wait_for_selector("#voices li")
        page.fill("#text", "Small screen.")
        speak(page)
        assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
        for sel in ("#text", "#voice", "#speed", "#seed", "#pin", "#speak", "#stop", "#download", "#metrics",
                    "#voices li .rename", "#voices li .delete", "#vid", "#vfile", "#vtext", "#upload", "#apikey"):
            box = page.locator(sel).first.bounding_box()
            assert page.locator(sel).first.is_visible() and box["x"] >= 0 and box["x"] + box["width"] <= 390, sel
        page.screenshot(path=str(ARTIFACTS / "webpage-phone.png"), full_page=True)
    finally:
        page.close()


def test_errors_are_shown(server, page):
    page.goto(server + "/")
    page.fill("#text", "")
    page.click("#speak")
    assert "type some text" in page.inner_text("#status")
    page.fill("#text", "x")
    page.select_option("#voice", "default")
    page.evaluate("document.getElementById('voice').add(new Option('gone', 'gone'))")
    page.select_option("#voice", "gone")
    page.click("#speak")
    page.wait_for_function("document.body.dataset.state === 'error'", timeout=60_000)
    assert "gone" in page.inner_text("#status") and page.get_attribute("#status", "class") == "error"


def test_with_an_api_key(browser, tmp_path):
    proc, url = start_server(tmp_path, TTS_API_KEY="sesame", TTS_DEFAULT_MAX_NEW_TOKENS="20")
    page = browser.new_page(bypass_csp=True)  # wait_for_function evaluates strings (eval): the test's, not the page's
    try:
        wait_ready(url, proc)
        page.goto(url + "/")
        page.wait_for_function("document.getElementById('status').className === 'error'", timeout=30_000)
        assert page.inner_text("#status").startswith("voices: ")  # the server's 401, shown
        page.fill("#apikey", "sesame")
        page.dispatch_event("#apikey", "change")
        page.wait_for_function("document.getElementById('status').textContent === 'API key set'", timeout=30_000)
        page.fill("#text", "With a key.")
        request, _ = speak(page)
        assert request.headers["authorization"] == "Bearer sesame"
    finally:
        page.close()
        stop(proc)


def test_the_page_runs_under_its_own_content_security_policy(server, browser):
    """/ sends a CSP that lets only the page's own inline script and style run (by hash), no framing, no sniffing;
    in Chromium the page loads and its script runs with no CSP violation. (The other tests here bypass the CSP:
    Playwright's wait_for_function evaluates strings, which the policy rightly forbids; the page uses no eval.)"""
    r = httpx.get(server + "/")
    csp = r.headers["content-security-policy"]
    assert "'unsafe-inline'" not in csp and "frame-ancestors 'none'" in csp and csp.count("'sha256-") == 2
    assert r.headers["x-frame-options"] == "DENY" and r.headers["x-content-type-options"] == "nosniff"
    page = browser.new_page()
    try:
        violations = []
        page.on("console", lambda m: violations.append(m.text) if "Content Security Policy" in m.text else None)
        page.goto(server + "/")
        page.wait_for_load_state("networkidle")
        page.locator("#speak").wait_for()
        assert page.evaluate("typeof window.ttsStats") == "object", "the page's own script did not run"
        assert violations == [], violations
    finally:
        page.close()
