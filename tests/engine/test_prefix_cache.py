"""Prefix caching and chunked prefill on CPU with the real engine (tiny golden checkpoint, fp32): the same
tokens with the cache as without it and as the eager engine; page accounting back to zero when idle; eviction
under a small KV pool; a prefix read by a running stream never evicted; chunked prefill's tokens equal whole
prefill's. The cache's and the page pool's bookkeeping alone (no torch) at the end."""

from __future__ import annotations

import io
import time

import numpy as np
import pytest
import soundfile as sf
from conftest import MODEL_DIR

from ttsengine import BusyError, Engine, EngineConfig, Reference, SynthesisRequest
from ttsengine.engine.control.page_pool import PagePool
from ttsengine.engine.control.prefix_cache import PrefixCache, prefix_key
from ttsengine.engine.control.scheduler import Job, Scheduler
from ttsengine.serving.voices import VoiceStore

AUDIO_TOL = 5e-5  # streaming vs whole-chunk decode, fp32


def voice_codes(seed: int, frames: int = 150) -> np.ndarray:
    """A stored voice's codes [4, frames] for the tiny model: its prompt prefix is ~170 positions (2 whole pages)."""
    rng = np.random.default_rng(seed)
    return np.concatenate([rng.integers(0, 32, (1, frames)), rng.integers(0, 16, (3, frames))]).astype(np.int64)


def wav(seed: int, samples: int = 320000) -> bytes:
    """~7 s of noise: ~160 code frames, so its prompt prefix fills 2 whole pages of 64."""
    buf = io.BytesIO()
    sf.write(buf, np.random.default_rng(seed).standard_normal(samples).astype(np.float32) * 0.1, 44100, format="WAV")
    return buf.getvalue()


def engine(**kw) -> Engine:
    return Engine.load(EngineConfig(model_dir=MODEL_DIR, device="cpu", max_batch=8, **kw))


class Recorder:
    """Every generated frame of every text chunk of a stream, as the engine hands them to its tasks. The spy is in
    place only inside `with` (or one `run`): streams are keyed by id(), and an id is reused once its stream is
    freed, so a spy left behind would file a later run's frames under an earlier stream (CI once saw two lists for
    one request)."""

    def __init__(self, eng: Engine):
        self.eng = eng
        self.frames: dict[int, list[np.ndarray]] = {}

    def __enter__(self) -> Recorder:
        original = self.original = self.eng._close

        def spy(task, reason):
            self.frames.setdefault(id(task.stream), []).append(np.stack(task.frames) if task.frames else None)
            original(task, reason)

        self.eng._close = spy
        return self

    def __exit__(self, *exc) -> None:
        self.eng._close = self.original

    def run(self, eng: Engine, reqs: list[SynthesisRequest]) -> list:
        assert eng is self.eng
        with self:
            streams = [eng.submit(r) for r in reqs]
            results = [s.result() for s in streams]
            return [(self.frames.pop(id(s)), r) for s, r in zip(streams, results)]


def same_tokens(a: list, b: list) -> None:
    assert len(a) == len(b)
    for (fa, _), (fb, _) in zip(a, b):
        assert len(fa) == len(fb) and all((x is None and y is None) or np.array_equal(x, y) for x, y in zip(fa, fb))


def same_as_eager(eager_engine, reqs, got) -> None:
    for req, (_, result) in zip(reqs, got):
        want = eager_engine.synthesize(req)
        assert [(c.frames, c.finish_reason, c.prompt_tokens) for c in result.chunks] == \
               [(c.frames, c.finish_reason, c.prompt_tokens) for c in want.chunks]
        assert len(result.audio) == len(want.audio) and np.abs(result.audio - want.audio).max() < AUDIO_TOL


def prefix_len(eng: Engine, text: str, codes: np.ndarray) -> int:
    import torch

    return eng.planner.prefix([(text, torch.as_tensor(codes))]).shape[1]


def idle_pages_balance(eng: Engine) -> None:
    """Idle: no job holds a page; every page is free or held once by the cache (and nothing is pinned)."""
    pool, cache = eng.scheduler.pool, eng.prefix_cache
    cached = {p for e in cache.entries.values() for p in e.pages} if cache is not None else set()
    assert pool.reserved == 0 and not any(pool.slot_pages)
    assert all(e.users == 0 for e in cache.entries.values()) if cache is not None else True
    assert sorted(pool.free + sorted(cached)) == list(range(1, len(pool.refs)))
    assert all(pool.refs[p] == (1 if p in cached else 0) for p in range(1, len(pool.refs)))


@pytest.fixture(scope="module")
def plain():
    eng = engine(prefix_cache=False)
    yield eng
    eng.close()


def test_a_stored_voice_is_prefilled_once_and_tokens_do_not_change(plain, eager_engine, tmp_path):
    cached = engine()
    try:
        store = VoiceStore(tmp_path, cached.planner.voice_codes, cached.planner.codec_tag, cached.planner.frame_rate,
                           forget=cached.forget_voice)
        voice = store.add("alice", wav(1), "the stored voice's transcript")
        ref = (Reference(text=voice.text, codes=voice.codes),)
        first = [SynthesisRequest(text="The first request.", seed=1, max_new_tokens=20, references=ref)]
        later = [SynthesisRequest(text=f"Request number {i}, at the same time.", seed=10 + i, max_new_tokens=25,
                                  references=ref, temperature=0.6 + 0.1 * i) for i in range(3)]
        later.append(SynthesisRequest(text="A long text in chunks. " * 4 + "The end.", seed=20, max_new_tokens=9,
                                      chunk_length=60, references=ref))  # its continuation chunks hit too
        with_cache, without = Recorder(cached), Recorder(plain)

        got = with_cache.run(cached, first)
        pages = prefix_len(cached, voice.text, voice.codes) // 64
        assert pages >= 1 and cached.prefix_cache.misses == 1 and cached.prefix_cache.hits == 0
        assert cached.stats().prefix_cached_pages == pages
        tokens_first = cached.metrics.prefill_tokens

        got += with_cache.run(cached, later)  # concurrent: every one a hit
        stats = cached.stats()
        chunks = len(got[-1][1].chunks)
        assert chunks >= 2 and stats.prefix_hits == 3 + chunks and stats.prefix_misses == 1
        assert stats.prefix_tokens_saved == (3 + chunks) * pages * 64
        # prefill_tokens_per_request drops by the cached prefix: hits prefill only from their first uncached page
        prompts = [c.prompt_tokens for _, r in got[1:] for c in r.chunks]
        assert cached.metrics.prefill_tokens - tokens_first == sum(p - 1 - pages * 64 for p in prompts)
        idle_pages_balance(cached)

        # the voice replaced: its cached prefix is dropped at once, the new voice's first request misses
        voice2 = store.add("alice", wav(2, 400000), "another transcript", replace=True)
        ref2 = (Reference(text=voice2.text, codes=voice2.codes),)
        after = [SynthesisRequest(text="Same id, new voice.", seed=30 + i, max_new_tokens=15, references=ref2)
                 for i in range(2)]
        got += with_cache.run(cached, after[:1]) + with_cache.run(cached, after[1:])
        stats = cached.stats()
        assert stats.prefix_misses == 2 and stats.prefix_hits == 3 + chunks + 1
        assert stats.prefix_cached_pages == prefix_len(cached, voice2.text, voice2.codes) // 64
        idle_pages_balance(cached)

        reqs = first + later + after
        same_tokens(got, without.run(plain, reqs))
        same_as_eager(eager_engine, reqs, got)
        assert plain.stats().prefix_hits == 0 and plain.stats().prefix_cached_pages == 0
    finally:
        cached.close()


def test_inline_references_are_keyed_by_content(plain):
    cached = engine()
    try:
        audio = wav(3)
        reqs = [SynthesisRequest(text=f"Inline voice {i}.", seed=40 + i, max_new_tokens=12,
                                 references=(Reference(text="words of the clip", audio=audio),)) for i in range(2)]
        other = SynthesisRequest(text="Inline voice 0.", seed=40, max_new_tokens=12,
                                 references=(Reference(text="words of the clip", audio=wav(4)),))
        rec = Recorder(cached)
        got = rec.run(cached, reqs[:1]) + rec.run(cached, reqs[1:]) + rec.run(cached, [other])
        assert (cached.prefix_cache.misses, cached.prefix_cache.hits) == (2, 1)  # other audio: another key
        same_tokens(got, Recorder(plain).run(plain, reqs + [other]))
        idle_pages_balance(cached)
    finally:
        cached.close()


def test_a_small_pool_evicts_least_recently_used_prefixes_and_serves_everything(plain):
    # 6 pages of 64: one request with a voice needs 3 (its 2 prefix pages included); 3 voices' prefixes do not
    # all stay cached beside a running request, so later requests evict the least recently used
    small = engine(kv_cache_tokens=384)
    try:
        refs = [(Reference(text=f"voice {v}", codes=voice_codes(v)),) for v in range(3)]
        order = [0, 1, 2, 0, 2, 1, 1]
        reqs = [SynthesisRequest(text=f"Sentence {i}.", seed=50 + i, max_new_tokens=20, references=refs[v])
                for i, v in enumerate(order)]
        rec = Recorder(small)
        got = [x for r in reqs for x in rec.run(small, [r])]  # one at a time: the LRU order is known
        cache = small.prefix_cache
        assert cache.evictions >= 2 and cache.hits >= 1 and cache.hits + cache.misses == len(reqs)
        idle_pages_balance(small)
        together = Recorder(small).run(small, reqs)  # all at once: admission waits for pages, nothing fails
        same_tokens(got, Recorder(plain).run(plain, reqs))
        same_tokens(together, got)
        idle_pages_balance(small)
    finally:
        small.close()


def test_chunked_prefill_gives_the_tokens_of_whole_prefill(plain, eager_engine):
    chunked = engine(prefill_tokens=7)  # far below every prompt: each goes in over many steps, between decodes
    try:
        seen = []
        original = chunked.runner.prefill

        def spy(items):
            seen.extend((it.start, it.stop, it.last) for it in items)
            original(items)

        chunked.runner.prefill = spy
        ref = (Reference(text="a voice", codes=voice_codes(7)),)
        reqs = [SynthesisRequest(text="Hello there.", seed=1, max_new_tokens=30),
                SynthesisRequest(text="A cloned voice, with a long prompt.", seed=2, max_new_tokens=25, references=ref),
                SynthesisRequest(text="Long text again. " * 5 + "Done.", seed=3, max_new_tokens=8, chunk_length=60,
                                 references=ref),
                SynthesisRequest(text="Short.", seed=4, max_new_tokens=12, temperature=0.5)]
        got = Recorder(chunked).run(chunked, reqs)
        assert all(stop - start <= 7 for start, stop, _ in seen) and sum(not last for *_, last in seen) > 40
        assert any(start > 0 and start % 64 for start, _, _ in seen)  # later chunks read their history
        same_tokens(got, Recorder(plain).run(plain, reqs))
        same_as_eager(eager_engine, reqs, got)
        idle_pages_balance(chunked)
    finally:
        chunked.close()


def test_a_burst_on_a_voice_not_cached_yet_prefills_its_prefix_once(plain):
    # four requests of a new voice in one intake (queued before the loop starts): one writes the prefix, the others
    # wait a step and start from its cached pages; the tokens are those of the engine without the cache
    codes = voice_codes(5)
    ref = (Reference(text="a voice nobody used yet", codes=codes),)
    reqs = [SynthesisRequest(text=f"Burst request {i}.", seed=40 + i, max_new_tokens=14, references=ref)
            for i in range(4)]
    cached = Engine.load(EngineConfig(model_dir=MODEL_DIR, device="cpu", max_batch=8), start=False)
    try:
        with Recorder(cached) as recorder:
            streams = [cached.submit(r) for r in reqs]
            cached.start()
            results = [st.result() for st in streams]
            got = [(recorder.frames.pop(id(st)), r) for st, r in zip(streams, results)]
        stats = cached.stats()
        assert (stats.prefix_misses, stats.prefix_hits) == (1, 3)
        assert stats.prefix_tokens_saved == 3 * (prefix_len(cached, ref[0].text, codes) // 64) * 64
        same_tokens(got, Recorder(plain).run(plain, reqs))
        idle_pages_balance(cached)
    finally:
        cached.close()


# ---- the bookkeeping alone ------------------------------------------------------------------------------------
def test_prefix_key_covers_whole_pages_of_the_prefix_only():
    import torch

    prompt = torch.arange(5 * 200).view(5, 200)
    key, pages = prefix_key(prompt, 150, 64)
    assert pages == 2 and key == prefix_key(torch.cat([prompt[:, :128], prompt[:, :50] + 1], 1), 140, 64)[0]
    assert prefix_key(prompt, 63, 64) == (None, 0)
    changed = prompt.clone()
    changed[3, 100] += 1  # a code inside the shared pages: another voice
    assert prefix_key(changed, 150, 64)[0] != key


def test_a_pinned_prefix_is_never_evicted_and_admission_counts_unpinned_pages_free():
    cache = PrefixCache()
    s = Scheduler(4, 8, 8, 16, 1000, cache)  # 8 usable pages
    pool = s.pool
    a = Job(40, 8, prefix_key="A", prefix_pages=2)  # 3 pages
    s.submit(a)
    plan = s.schedule()  # its whole prompt: the plan allocates its pages and caches the prefix's whole pages
    assert plan.pages[a.slot] == tuple(pool.slot_pages[a.slot]) and len(plan.pages[a.slot]) == 3
    assert a.prefix is cache.lookup("A") and not s.can_cache(a)
    assert (s.pool.reserved, cache.pinned_pages) == (1, 2)  # moved from the job's reservation to the pinned
    hit = Job(40, 8, prefix_key="A", prefix_pages=2)
    s.submit(hit)
    plan = s.schedule()
    (chunk,) = plan.chunks
    assert chunk.job is hit and chunk.start == 32 and hit.prefix is a.prefix and cache.hits == 1
    assert plan.pages[hit.slot][:2] == tuple(a.prefix.pages)  # the slot starts with the cached pages
    assert s.pool.reserved == 2 and cache.pinned_pages == 2 and len(pool.free) == 4
    # 4 pages free: a job of 5 waits while A is pinned (its pages are read), although A is cached
    big = Job(70, 10)
    s.submit(big)
    assert s.schedule().chunks == []
    s.release([a, hit])  # both done: A stays cached, unpinned, so its pages count as free
    assert cache.pinned_pages == 0 and cache.cached_pages == 2 and len(pool.free) == 6
    (chunk,) = s.schedule().chunks
    assert chunk.job is big
    pool.grow(big.slot, big.max_len - 1)  # all its 5 pages (as its decode steps would): the free list, no eviction
    assert cache.evictions == 0 and len(pool.free) == 1
    small = Job(40, 8)  # 3 pages: 1 free + A's 2, which admission counted as free
    s.submit(small)
    (chunk,) = s.schedule().chunks
    assert chunk.job is small
    assert cache.evictions == 1 and not cache.entries and pool.free == []


def test_a_burst_on_a_new_prefix_computes_it_once():
    # three requests of a voice not cached yet, arriving together: the first writes the prefix's pages, the others
    # wait (FIFO: so does the request behind them) until those are cached, then start from them as hits
    cache = PrefixCache()
    s = Scheduler(8, 8, 39, 16, 1000, cache)
    first, second, third = (Job(40, 8, prefix_key="V", prefix_pages=2) for _ in range(3))
    other = Job(20, 8)
    for j in (first, second, third, other):
        s.submit(j)
    (chunk,) = s.schedule().chunks  # the first writes the prefix; its plan caches the pages once written
    assert chunk.job is first and list(s.waiting) == [second, third, other] and cache.misses == 1
    assert first.prefix is cache.lookup("V")
    chunks = s.schedule().chunks
    assert [c.job for c in chunks] == [second, third, other] and [c.start for c in chunks] == [32, 32, 0]
    assert second.prefix is third.prefix is first.prefix and (cache.hits, cache.misses) == (2, 1)


def test_a_prefix_writer_that_leaves_stops_the_wait():
    # the job writing the prefix is cancelled before its pages are cached: the next one computes it
    cache = PrefixCache()
    s = Scheduler(8, 8, 39, 16, 20, cache)  # 20 positions a step: the prefix (32) takes two steps
    writer, waiting = Job(40, 8, prefix_key="V", prefix_pages=2), Job(40, 8, prefix_key="V", prefix_pages=2)
    s.submit(writer)
    s.submit(waiting)
    assert [c.job for c in s.schedule().chunks] == [writer] and writer.prefilled == 20
    s.release([writer])  # it leaves (cancelled) with its prefix half written
    (chunk,) = s.schedule().chunks
    assert chunk.job is waiting and chunk.start == 0 and waiting.prefix is None and cache.misses == 2


def test_eviction_skips_pinned_entries_and_fails_loudly_without_room():
    cache = PrefixCache()
    pool = PagePool(num_pages=5, max_slots=2, page_size=16, cache=cache)
    pool.grow(0, 31)
    pinned = cache.insert("P", pool.keep(0, 2))  # users 1: a running job reads it
    pool.release(0)
    pool.grow(1, 31)  # the 2 other pages
    with pytest.raises(RuntimeError, match="out of KV pages"):
        pool.grow(1, 32)
    assert cache.entries["P"] is pinned and cache.evictions == 0
    cache.unpin(pinned)
    pool.grow(1, 32)
    assert cache.evictions == 1 and "P" not in cache.entries


def test_forget_frees_unpinned_pages_at_once_and_pinned_ones_first_when_unread():
    cache = PrefixCache()
    a, b = cache.insert("A", [1, 2]), cache.insert("B", [3])
    cache.unpin(a)
    assert cache.forget("A") == [1, 2] and cache.lookup("A") is None
    assert cache.forget("B") == [] and cache.lookup("B") is None and cache.cached_pages == 1  # still read
    cache.insert("C", [4])
    cache.unpin(cache.entries["C"])
    cache.unpin(b)
    assert cache.evict() == [3]  # the forgotten entry goes first, before the older-used C


def test_page_counters_follow_every_change():
    # cached/pinned pages are counters (read from HTTP threads and every step), kept equal to the entries' sums
    import random

    cache, rng, users = PrefixCache(), random.Random(0), []
    for i in range(400):
        op = rng.choice(["insert", "pin", "unpin", "evict", "forget"])
        if op == "insert":
            users.append(cache.insert(f"k{i}", list(range(rng.randint(1, 4)))))
        elif op == "pin" and cache.entries:
            entry = rng.choice(list(cache.entries.values()))
            if not entry.key.startswith("forgotten"):
                cache.pin(entry, 64)
                users.append(entry)
        elif op == "unpin" and users:
            cache.unpin(users.pop(rng.randrange(len(users))))
        elif op == "evict":
            cache.evict()
        elif op == "forget" and cache.entries:
            cache.forget(rng.choice(list(cache.entries)))
        assert cache.cached_pages == sum(len(e.pages) for e in cache.entries.values())
        assert cache.pinned_pages == sum(len(e.pages) for e in cache.entries.values() if e.users)


def wait_idle(eng: Engine, timeout: float = 60) -> None:
    end = time.time() + timeout
    while not eng.intake.idle():
        assert time.time() < end, "the engine never went idle"
        time.sleep(0.05)
    time.sleep(0.2)  # the loop's last iteration releases what it held


@pytest.mark.parametrize("seed", [0, 1])
def test_cancels_mid_chunked_prefill_and_forgotten_voices_leave_the_pages_balanced(seed):
    # a small pool, a 16-token budget (every voice prompt goes in chunks), streams cancelled between their chunks,
    # voices forgotten while their prefixes are read (helper-12's stress run, kept as a test)
    import random

    eng = engine(kv_cache_tokens=640, prefill_tokens=16)
    rng = random.Random(seed)
    try:
        refs = [(Reference(text=f"voice {v}", codes=voice_codes(v)),) for v in range(3)]
        original, cancel_after, cut = eng.runner.prefill, {}, []

        def spy(items):
            original(items)
            for job in list(eng.scheduler.running):
                stream = job.owner.stream
                if id(stream) in cancel_after and not job.decoding:
                    cancel_after[id(stream)] -= 1
                    if cancel_after[id(stream)] == 0:
                        cut.append(stream)
                        stream.cancel()

        eng.runner.prefill = spy
        streams = []
        for i in range(14):
            req = SynthesisRequest(text=f"Sentence number {i} here." + " More text." * rng.randrange(0, 6), seed=i,
                                   max_new_tokens=rng.randrange(3, 15), chunk_length=rng.choice([60, 200]),
                                   references=refs[rng.randrange(3)])
            try:
                stream = eng.submit(req)
            except BusyError:
                continue
            if rng.random() < 0.4:
                cancel_after[id(stream)] = rng.randrange(1, 6)
            streams.append(stream)
            if rng.random() < 0.3:
                v = refs[rng.randrange(3)][0]
                eng.forget_voice(v.text, v.codes)
            time.sleep(rng.random() * 0.05)
        for stream in streams:
            try:
                stream.result()
            except Exception as e:  # noqa: BLE001 - only a cancellation may end a stream early
                assert stream in cut, f"{type(e).__name__}: {e}"
        assert cut  # some streams were cut mid-prefill
        wait_idle(eng)
        idle_pages_balance(eng)
    finally:
        eng.close()


def test_an_engine_error_mid_chunked_prefill_returns_every_page_and_serves_on(plain):
    eng = engine(kv_cache_tokens=1280, prefill_tokens=16)
    try:
        ref = (Reference(text="voice", codes=voice_codes(1)),)
        eng.synthesize(SynthesisRequest(text="warm the cache.", seed=1, max_new_tokens=5, references=ref))
        assert eng.stats().prefix_cached_pages > 0
        original, calls = eng.runner.prefill, []

        def boom(items):
            calls.append(items)
            if len(calls) == 4:
                raise RuntimeError("simulated failure in a prefill chunk")
            original(items)

        eng.runner.prefill = boom
        streams = [eng.submit(SynthesisRequest(text=f"Request {i} " * 5, seed=i, max_new_tokens=6, references=ref))
                   for i in range(3)]
        failed = 0
        for s in streams:
            try:
                s.result()
            except Exception:  # noqa: BLE001 - the failed step fails the requests it held
                failed += 1
        assert failed >= 1
        wait_idle(eng)
        idle_pages_balance(eng)
        reqs = [SynthesisRequest(text=f"After {i}.", seed=9 + i, max_new_tokens=8, references=ref) for i in range(2)]
        same_tokens(Recorder(eng).run(eng, reqs), Recorder(plain).run(plain, reqs))
        idle_pages_balance(eng)
    finally:
        eng.close()
