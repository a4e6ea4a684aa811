"""The engine in its own process (serving/engine_process), for real: a child process on the tiny checkpoint, driven
through RemoteFleet as the Service drives it, against the same requests in one process."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import time

import numpy as np
import pytest
from conftest import MODEL_DIR

from ttsengine import EngineConfig, Fleet
from ttsengine.errors import CheckpointError, EngineDown, InputError
from ttsengine.serving.engine_process.remote_fleet import RemoteFleet
from ttsengine.serving.failure import ModelFailed
from ttsengine.serving.service import Service, engine_loader, own_process
from ttsengine.synthesis.request import Reference, SynthesisRequest

CONFIG = EngineConfig(model_dir=MODEL_DIR, device="cpu", max_batch=4, process="on")
REQUESTS = [SynthesisRequest(text="Hello there.", seed=2, max_new_tokens=20, keep_codes=True),
            SynthesisRequest(text="A second voice, a little longer.", seed=5, max_new_tokens=30, keep_codes=True)]


@pytest.fixture(scope="module")
def remote():
    fleet = RemoteFleet.spawn(CONFIG)
    yield fleet
    fleet.close()


@pytest.fixture(scope="module")
def local():
    fleet = Fleet.load(CONFIG)
    yield fleet
    fleet.close()


def test_the_engine_process_makes_the_same_audio_and_reports(remote, local):
    got = [remote.submit(r) for r in REQUESTS]
    want = [local.submit(r) for r in REQUESTS]
    for g, w in zip(got, want):
        a, b = g.result(), w.result()
        # the same codes exactly; the audio within the codec's batching noise (rows decoded together differ)
        assert [c.tolist() for c in g.plan.codes] == [c.tolist() for c in w.plan.codes]
        assert a.audio.shape == b.audio.shape and np.abs(a.audio - b.audio).max() < 1e-4
        assert g.seed == w.seed and g.frames == w.frames > 0 and g.text_chunks == w.text_chunks
        assert g.reports == w.reports and g.ttfa is not None and g.queue_wait is not None
    assert len(got[1].plan.codes) == 1  # a live session's next context crosses too
    assert remote.open_streams == 0 and remote.ready and remote.failure is None


def test_refusals_keep_their_kind_and_message(remote, local):
    bad = SynthesisRequest(text="x", temperature=-1.0)
    with pytest.raises(InputError) as here:
        local.submit(bad)
    with pytest.raises(InputError) as there:
        remote.submit(bad)
    assert str(there.value) == str(here.value)
    assert remote.open_streams == 0


def test_cancel_crosses_and_frees_the_slot(remote):
    before = remote.stats().total.cancelled
    stream = remote.submit(SynthesisRequest(text="Keep talking for a while.", seed=3, max_new_tokens=400))
    next(iter(stream))  # it runs
    stream.cancel()
    list(stream)  # ends (no error: a cancelled stream just stops)
    deadline = time.monotonic() + 30
    while remote.stats().total.cancelled == before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert remote.stats().total.cancelled == before + 1 and remote.open_streams == 0


def test_admit_on_the_event_loop_is_submit_without_a_thread(remote):
    # direct_admit: the same stream as submit() gives, with the engine process's stages marked on it
    via_thread = remote.submit(REQUESTS[0])
    direct = asyncio.run(remote.admit(REQUESTS[0]))
    a, b = direct.result(), via_thread.result()
    assert [c.tolist() for c in direct.plan.codes] == [c.tolist() for c in via_thread.plan.codes]
    assert np.array_equal(a.audio, b.audio) or np.abs(a.audio - b.audio).max() < 1e-4
    assert direct.plan.texts == via_thread.plan.texts and direct.seed == via_thread.seed == 2
    marks = direct.marks
    assert direct.submitted_at < marks["received"] < marks["planned"] and \
        marks["received"] < direct.started_at < marks["engine_audio"] <= direct.first_audio_at, marks
    with pytest.raises(InputError, match="temperature"):  # a refusal keeps its kind, and nothing is left open
        asyncio.run(remote.admit(SynthesisRequest(text="x", temperature=-1.0)))
    assert remote.open_streams == 0


def test_the_service_admits_directly_only_with_the_feature_and_no_audio_to_send(remote):
    # the planning threads closed: a request that still needs one fails to be scheduled there
    wav = MODEL_DIR.parent / "reference.wav"
    voice = Reference(text="A voice.", audio=wav.read_bytes() if wav.exists() else b"RIFF")
    for features, direct in (("auto", True), ("-direct_admit", False)):
        service = Service(lambda: remote, None, features).load()
        service.planning.close()  # not service.close(): the module's fleet serves the other tests
        if direct:
            assert asyncio.run(service.admit(REQUESTS[0])).result().frames > 0
        else:
            with pytest.raises(RuntimeError, match="shutdown"):
                asyncio.run(service.admit(REQUESTS[0]))
        with pytest.raises(RuntimeError, match="shutdown"):  # reference audio: megabytes, sent from a thread
            asyncio.run(service.admit(SynthesisRequest(text="Hi.", references=(voice,))))
    assert remote.open_streams == 0


def test_admit_given_up_frees_what_the_engine_took(remote):
    # the caller cancelled (its client left) while the engine process planned it: CANCEL follows the SUBMIT, and
    # the engine either drops it or stops it; nothing stays open on either side
    before = remote.stats().total

    async def leave():
        task = asyncio.ensure_future(remote.admit(SynthesisRequest(text="Keep talking for a while.", seed=4,
                                                                   max_new_tokens=400)))
        await asyncio.sleep(0)  # the SUBMIT is out
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(leave())
    deadline = time.monotonic() + 30
    while (remote.open_streams or remote.stats().total.running) and time.monotonic() < deadline:
        time.sleep(0.05)
    after = remote.stats().total
    assert remote.open_streams == 0 and after.running == 0 and after.waiting == 0
    assert after.requests_done - before.requests_done <= 1  # stopped at once, if it was taken in at all


def test_stats_voice_codes_and_facts_come_from_the_engine(remote, local):
    assert (remote.sample_rate, remote.frame_rate, remote.codec_tag) == \
           (local.sample_rate, local.frame_rate, local.codec_tag)
    assert remote.max_streams == local.max_streams == 4
    wav = (MODEL_DIR.parent / "reference.wav") if (MODEL_DIR.parent / "reference.wav").exists() else None
    if wav is not None:
        assert np.array_equal(remote.voice_codes(wav.read_bytes()), local.voice_codes(wav.read_bytes()))
    stats = remote.stats()
    assert stats.total.requests_done >= 2 and stats.engines[0].device == "cpu"


def test_a_dead_engine_process_ends_its_streams_and_says_so(tmp_path):
    fleet = RemoteFleet.spawn(CONFIG)
    svc = Service(lambda: fleet, None).load()
    try:
        stream = svc.submit(SynthesisRequest(text="Keep talking for a while.", seed=3, max_new_tokens=2000))
        next(iter(stream))
        os.kill(fleet.process.pid, signal.SIGKILL)
        with pytest.raises(EngineDown, match="exited unexpectedly"):
            stream.result()
        assert not svc.ready and svc.health()["status"] == "failed" and "exit code -9" in svc.error
        with pytest.raises(ModelFailed, match="engine process exited"):  # 503 with the reason
            svc.submit(REQUESTS[0])
    finally:
        svc.close()


def test_a_failed_load_raises_what_the_engine_raised(tmp_path):
    config = CONFIG.with_(model_dir=tmp_path / "nowhere")
    with pytest.raises(CheckpointError) as there:
        RemoteFleet.spawn(config)
    with pytest.raises(CheckpointError) as here:
        Fleet.load(config)
    assert str(there.value) == str(here.value)


def test_close_ends_the_process_and_what_was_open():
    fleet = RemoteFleet.spawn(CONFIG)
    stream = fleet.submit(SynthesisRequest(text="Keep talking for a while.", seed=3, max_new_tokens=2000))
    next(iter(stream))
    fleet.close()
    assert fleet.process.poll() is not None  # no orphan
    with pytest.raises(Exception):  # noqa: B017 - ended with the engine's shutdown error, as in one process
        stream.result()
    assert stream.done and fleet.open_streams == 0


def test_the_switch():
    assert own_process(CONFIG) and not own_process(CONFIG.with_(process="off"))
    assert not own_process(CONFIG.with_(process="auto"))  # cpu: one process
    assert own_process(EngineConfig(devices="cuda:0,cuda:1")) and own_process(EngineConfig(device="cuda"))
    fleet = engine_loader(CONFIG.with_(process="off"))()
    try:
        assert isinstance(fleet, Fleet)
    finally:
        fleet.close()


@pytest.mark.parametrize("plan_thread", [False, True])
def test_plain_requests_are_planned_by_one_thread_with_plan_thread(plan_thread):
    # the host over a real pipe and a real fleet (here, not in a child: the test sees its threads): with plan_thread
    # every request without reference audio is planned by the one plan thread, a request with reference audio by the
    # pool (its encode must not hold up the plain ones); without, the pool plans all. Each gets its audio either way
    import io
    import multiprocessing
    import threading

    import soundfile as sf

    from ttsengine.serving.engine_process.host import Host
    from ttsengine.serving.engine_process.wire import ACCEPTED, CLOSE, END, SUBMIT, unpack_error

    fleet = Fleet.load(CONFIG)
    planned_by: dict[str, str] = {}
    real = fleet.submit

    def submit(request, **kw):
        planned_by[request.text] = threading.current_thread().name.rsplit("_", 1)[0]
        return real(request, **kw)

    fleet.submit = submit
    front, back = multiprocessing.Pipe()
    host = threading.Thread(target=Host(fleet, back, plan_thread).serve, daemon=True)
    host.start()
    plain = [SynthesisRequest(text=f"Plain number {i}.", seed=i, max_new_tokens=6) for i in range(3)]
    wav = io.BytesIO()
    sf.write(wav, np.random.default_rng(0).normal(0, 0.1, 16000).astype(np.float32), 16000, format="WAV")
    voiced = SynthesisRequest(text="With a voice.", seed=9, max_new_tokens=6,
                              references=(Reference(text="ref", audio=wav.getvalue()),))  # 1 s to encode
    front.send([(SUBMIT, sid, r, False) for sid, r in enumerate([*plain, voiced])])
    accepted, ended = set(), {}
    end = time.monotonic() + 60
    while len(ended) < 4 and time.monotonic() < end:
        if front.poll(0.5):
            for msg in front.recv():
                if msg[0] == ACCEPTED:
                    accepted.add(msg[1])
                elif msg[0] == END:
                    ended[msg[1]] = unpack_error(msg[2])
    front.send([(CLOSE,)])
    host.join(30)
    assert accepted == {0, 1, 2, 3} and ended == dict.fromkeys(range(4)), ended
    want = "engine-process-plan" if plan_thread else "engine-process-call"
    assert [planned_by[r.text] for r in plain] == [want] * 3
    assert planned_by["With a voice."] == "engine-process-call"


@pytest.mark.parametrize("features", ["+plan_thread", "-short_switch"])
def test_an_engine_process_with_plan_thread_or_without_short_switch_makes_the_same_audio(local, features):
    fleet = RemoteFleet.spawn(dataclasses.replace(CONFIG, features=features))
    try:
        got = [fleet.submit(r).result() for r in REQUESTS]
    finally:
        fleet.close()
    for g, want in zip(got, [local.submit(r).result() for r in REQUESTS]):
        np.testing.assert_array_equal(g.audio, want.audio)


def test_short_switch_sets_the_engine_process_gil_interval():
    from ttsengine.serving.engine_process.host import SHORT_SWITCH_S, switch_interval

    assert switch_interval("+short_switch") == switch_interval("auto") == SHORT_SWITCH_S == 0.0005  # on by default
    assert switch_interval("-short_switch") is None and switch_interval("all,-short_switch") is None


@pytest.mark.gpu
def test_an_engine_process_on_any_gpu_uses_the_variants_traced_on_the_first(tmp_path):
    # feature own_gpu_view: the process for the machine's last GPU sees it as cuda:0, so it loads the decode-step
    # variants a process on cuda:0 traced into the same cache directory (their guards check the device index) and
    # traces none; the front still names the GPU it asked for. With two GPUs, the control: without the view the
    # process on cuda:1 traces variants of its own.
    import torch

    last = f"cuda:{torch.cuda.device_count() - 1}"

    def run(device: str, features: str = "-layer_gemv"):  # layer_gemv: the tiny model's 4 rows use no compiled units
        fleet = RemoteFleet.spawn(CONFIG.with_(device="auto", devices=device, cache_dir=str(tmp_path),
                                               features=features))
        try:
            with open(f"/proc/{fleet.process.pid}/environ", "rb") as f:
                env = dict(e.split(b"=", 1) for e in f.read().split(b"\0") if b"=" in e)
            fleet.synthesize(REQUESTS[0])
            assert fleet.settle()
            return fleet.stats().engines[0], env.get(b"CUDA_VISIBLE_DEVICES")
        finally:
            fleet.close()

    first, _ = run("cuda:0")
    if first.precompiled == "off":
        pytest.skip("no precompiled units on this torch / GPU")
    traced = int(first.precompiled.split(", ")[1].split()[0])
    assert traced > 0 and first.device == "cuda:0"
    inherited = os.environ.get("CUDA_VISIBLE_DEVICES")
    seen, visible = run(last)
    want = last[5:] if inherited is None else inherited.split(",")[int(last[5:])].strip()
    assert (seen.device, seen.codec_device, visible) == (last, last, want.encode())
    assert seen.precompiled == f"{traced} loaded, 0 traced"
    if last != "cuda:0":
        control, visible = run(last, "-layer_gemv,-own_gpu_view")
        assert visible == (None if inherited is None else inherited.encode()) and control.device == last
        assert not control.precompiled.endswith(", 0 traced"), control.precompiled
