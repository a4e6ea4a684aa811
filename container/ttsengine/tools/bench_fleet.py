"""The engines `bench` drives (issue 49): a Fleet in this process (--engine-process off, the old layout: every engine
loop shares this process's GIL) or one engine process per GPU behind a ProcessFleet (on: as the server runs them,
engine/placement.py's process_configs). bench's levels read either through this one object: streams, each engine's
counters (FleetStats), GPU indices from the placement, VRAM, a stored voice. What only an in-process engine can give
(its checkpoint, dtype, kernels; the whole decode --check-audio compares with) is None in process mode, and the
report says why (in_process_only).
"""

from __future__ import annotations

import asyncio
import io
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import soundfile as sf
import torch

from ..config import EngineConfig
from ..engine import features
from ..engine.fleet import Fleet
from ..engine.placement import placements, process_configs
from ..engine.stats import EngineStats
from ..errors import BusyError, TTSError
from ..model.quant import weight_bytes
from ..serving.engine_process.process_fleet import ProcessFleet
from ..synthesis.plan import Plan
from ..synthesis.request import Reference, SynthesisRequest
from ..synthesis.stream import Stream

# the report's fields read from an in-process engine; None with --engine-process on
IN_PROCESS_ONLY = ("codec_cache", "dtype", "compile_error", "fused_kernels", "prefix_cache", "weights_gb",
                   "first_chunk_frames", "stream_chunk_frames")


def cuda_count() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@dataclass
class BenchFleet:
    fleet: Fleet | ProcessFleet
    gpus: tuple[int, ...]  # the CUDA device indices the engines use (DualARs and codecs), from the placement
    load_s: float  # in process mode: the processes' start, load and warm-up (they are not told apart from here)
    direct: bool = False  # engine processes with feature direct_admit: requests handed over as the server does

    @property
    def in_process(self) -> bool:
        return isinstance(self.fleet, Fleet)

    @classmethod
    def start(cls, config: EngineConfig, random_weights: str | None, engine_process: bool) -> BenchFleet:
        """Every engine warm, its lazily captured graphs in (a server captures them while idle); TTSError naming the
        first engine that did not start."""
        count = cuda_count()
        gpus = tuple(sorted({int(d.removeprefix("cuda:")) for p in placements(config, count)
                             for d in (p.device, p.codec_device) if d.startswith("cuda")}))
        t0 = time.perf_counter()
        if engine_process:
            fleet = ProcessFleet.spawn(process_configs(config, count), random_weights)  # loads and warms up
            load_s = time.perf_counter() - t0
        else:
            fleet = Fleet.load(config, random_weights, start=False)
            load_s = time.perf_counter() - t0
            fleet.start()
        fleet.wait_all()  # every engine, not just the first ready: a level must see all of them
        bad = next((e for e in fleet.stats().engines if e.state != "ready"), None)
        if bad is not None:
            fleet.close()
            raise TTSError(f"the engine on {bad.device} did not start: {bad.error}")
        fleet.settle()
        return cls(fleet, gpus, load_s, engine_process and not features.switched_off(config.features,
                                                                                    features.DIRECT_ADMIT))

    def submit(self, request: SynthesisRequest | Plan, ignore_stop: bool = True) -> Stream:
        return self.fleet.submit(request, ignore_stop=ignore_stop)

    def submit_all(self, arrivals: list[float], request_of: Callable[[int], SynthesisRequest | Plan], t0: float,
                   refused: Callable[[], None]) -> list[Stream]:
        """Request i submitted at t0 + arrivals[i] (perf_counter seconds); the streams the engines took, in arrival
        order (refused() called for each BusyError). With `direct` as the server with direct_admit does it: an event
        loop hands each request over and awaits its answer while the next ones go out. Otherwise one after another
        from this thread, each waiting for its engine to take it (in process: planned here first): 512 requests to
        two engine processes took ~650 ms that way, twice one GPU's ramp, in a level of 3-4 s (docs/performance.md)."""
        if self.direct:
            return asyncio.run(self._admit_all(arrivals, request_of, t0, refused))
        streams = []
        for i, at in enumerate(arrivals):
            delay = t0 + at - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            try:
                streams.append(self.submit(request_of(i)))
            except BusyError:
                refused()
        return streams

    async def _admit_all(self, arrivals: list[float], request_of: Callable[[int], SynthesisRequest | Plan],
                         t0: float, refused: Callable[[], None]) -> list[Stream]:
        async def one(i: int, at: float) -> Stream | None:
            delay = t0 + at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            try:
                return await self.fleet.admit(request_of(i), ignore_stop=True)
            except BusyError:
                refused()
                return None

        got = await asyncio.gather(*(one(i, at) for i, at in enumerate(arrivals)), return_exceptions=True)
        error = next((g for g in got if isinstance(g, BaseException)), None)
        streams = [g for g in got if isinstance(g, Stream)]
        if error is not None:  # an InputError, every engine down...: the level ends, nothing left generating
            for s in streams:
                s.cancel()
            raise error
        return streams

    def engines(self) -> tuple[EngineStats, ...]:
        """Each engine's stats, in TTS_DEVICES order (counters: EngineStats.since)."""
        return self.fleet.stats().engines

    def close(self) -> None:
        self.fleet.close()

    # ---- VRAM: torch's counters in this process; the engine processes report only what is allocated now -------
    def reset_peak(self) -> int:
        """-> bytes allocated now on the busiest GPU (0 without one), with the peak counters reset where they can be."""
        if not self.in_process:
            return max((e.gpu_memory_allocated_bytes or 0 for e in self.engines()), default=0)
        for d in self.gpus:
            torch.cuda.synchronize(d)
            torch.cuda.reset_peak_memory_stats(d)
        return max((torch.cuda.memory_allocated(d) for d in self.gpus), default=0)

    def peak(self) -> int | None:
        """Bytes allocated at most on the busiest GPU since reset_peak; None: not known (engine processes: NVML's
        vram_used_peak_gb says what the devices held)."""
        if not self.in_process:
            return None
        return max((torch.cuda.max_memory_allocated(d) for d in self.gpus), default=0)

    # ---- what needs the engines in this process ------------------------------------------------------------------
    def kept(self, request: SynthesisRequest) -> Plan:
        """The request planned here, keeping its codes for check (the engine plans a request otherwise)."""
        plan = self._first().planner.plan(request)
        plan.keep_codes = True
        return plan

    def whole(self, stream: Stream) -> np.ndarray:
        """The whole decode of a finished stream's kept codes (float32 [L]), by the engine that ran it."""
        engines = self._in_process().engines
        engine = next((e for e in engines if str(e.runner.device) == stream.device), engines[0])
        return engine.vocoder.whole(stream.plan.codes)

    def settings(self) -> dict:
        """The report's IN_PROCESS_ONLY fields (None with engine processes) and the device's name."""
        first = self.engines()[0]
        if not self.in_process:
            return {"device": gpu_name(self.gpus[0]) if first.device.startswith("cuda") else "cpu",
                    **dict.fromkeys(IN_PROCESS_ONLY)}
        engine = self._first()
        ckpt = engine.ckpt
        return {"device": torch.cuda.get_device_name() if engine.runner.device.type == "cuda" else "cpu",
                "codec_cache": ckpt.codec_cache, "dtype": str(engine.runner.dtype),
                "compile_error": engine.device.compile_error, "fused_kernels": sorted(engine.runner.fused_in_use),
                "prefix_cache": engine.prefix_cache is not None,
                "weights_gb": round((weight_bytes(ckpt.model) + weight_bytes(ckpt.codec)) / 1e9, 3),
                "first_chunk_frames": engine.settings.first_chunk_frames,
                "stream_chunk_frames": engine.settings.stream_chunk_frames}

    def _in_process(self) -> Fleet:
        if not self.in_process:
            raise TTSError("this needs the engines in this process (--engine-process off)")
        return self.fleet

    def _first(self):
        return self._in_process().engines[0]

    # ---- a stored voice, as the server stores one: codes of the audio's WAV, by the fleet's codec ----------------
    def random_voice(self, seconds: float, words: list[str]) -> Reference:
        """A stored voice of `seconds` of random speech-like audio (tones with a wandering pitch, plus noise),
        encoded once (codes), with a transcript of ~2.5 words per second taken in turn from `words`."""
        rate = self.fleet.sample_rate
        rng = np.random.default_rng(1)
        t = np.arange(int(seconds * rate)) / rate
        pitch = 140 + 40 * np.sin(2 * np.pi * 0.7 * t)
        audio = 0.3 * np.sin(2 * np.pi * np.cumsum(pitch) / rate) * (0.6 + 0.4 * np.sin(2 * np.pi * 3 * t))
        audio = (audio + 0.02 * rng.standard_normal(len(t))).astype(np.float32)
        wav = io.BytesIO()
        sf.write(wav, audio, rate, format="WAV", subtype="FLOAT")  # float: the samples as they are, at the codec's rate
        codes = np.asarray(self.fleet.voice_codes(wav.getvalue()))
        text = " ".join(words[i % len(words)] for i in range(max(1, round(seconds * 2.5))))
        return Reference(text=text + ".", codes=codes)


def gpu_name(index: int) -> str:
    """The GPU's name from NVML (this process starts no CUDA context for it: the engines' processes hold the GPUs)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(index))
        return name.decode() if isinstance(name, bytes) else name
    except Exception:  # noqa: BLE001 - no NVML: the index only
        return f"cuda:{index} (no NVML for its name)"
