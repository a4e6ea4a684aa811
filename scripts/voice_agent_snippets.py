"""Runs docs/voice-agents.md's LiveKit and Pipecat snippets, as written there, against a running server:

    python scripts/voice_agent_snippets.py http://127.0.0.1:8080 [livekit|pipecat]

Each snippet block is executed with its BASE replaced by the URL; then every TTS object it made speaks a few
sentences: LiveKit's through stream() (or synthesize() for OpenAI's), with no room; Pipecat's in a two-processor
pipeline (TTSSpeakFrame in, audio frames counted), with no transport. Prints one line per service: seconds of audio,
the rate, and any error (a service that fails does not stop the others); exits 1 when one made no audio or failed.
scripts/ci/agents.sh runs it in CI. Needs the framework installed in the running interpreter
(livekit-agents with the fishaudio, elevenlabs and openai plugins; pipecat-ai[elevenlabs,fish,openai]) and, for the
Fish services, a stored voice `alice` on the server.
"""

from __future__ import annotations

import asyncio
import re
import sys
from pathlib import Path

DOC = Path(__file__).resolve().parents[1] / "docs" / "voice-agents.md"
TEXT = ["Hello there, ", "friend. How are ", "you today?"]


def snippet(name: str, url: str) -> dict:
    block = re.search(rf"<!-- snippet: {name} -->\n```python\n(.*?)```", DOC.read_text(), re.S).group(1)
    namespace: dict = {}
    exec(compile(block.replace('"http://127.0.0.1:8080"', repr(url)), f"{DOC.name}:{name}", "exec"), namespace)
    return {k: v for k, v in namespace.items() if k.endswith("_tts")}


async def livekit(url: str) -> dict:
    import aiohttp

    results = {}
    async with aiohttp.ClientSession() as http:
        for name, tts in snippet("livekit", url).items():
            if hasattr(tts, "_session"):
                tts._session = http  # outside a LiveKit job: the session an agent's job would give it
            try:
                events = await asyncio.wait_for(speak(tts), 120)
            except Exception as e:  # noqa: BLE001 - reported as this service's result; the others still run
                results[name] = (0.0, None, one_line(e))
                continue
            samples = sum(ev.frame.samples_per_channel for ev in events)
            results[name] = (samples / events[-1].frame.sample_rate if events else 0.0,
                             events[-1].frame.sample_rate if events else None)
    return results


async def speak(tts) -> list:
    """A LiveKit TTS object's audio events for TEXT: stream() with the text in pieces, or synthesize()."""
    if not tts.capabilities.streaming:
        return [ev async for ev in tts.synthesize("".join(TEXT))]
    stream = tts.stream()
    try:
        for piece in TEXT:
            stream.push_text(piece)
        stream.end_input()
        return [ev async for ev in stream]
    finally:
        await stream.aclose()


def one_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {' '.join(str(e).split())}"[:300]


async def pipecat(url: str) -> dict:
    from pipecat.frames.frames import EndFrame, ErrorFrame, TTSAudioRawFrame, TTSSpeakFrame
    from pipecat.pipeline.pipeline import Pipeline
    from pipecat.pipeline.runner import PipelineRunner
    from pipecat.pipeline.task import PipelineParams, PipelineTask
    from pipecat.processors.frame_processor import FrameProcessor

    class Count(FrameProcessor):
        def __init__(self):
            super().__init__()
            self.samples, self.rate, self.errors = 0, None, []

        async def process_frame(self, frame, direction):
            await super().process_frame(frame, direction)
            if isinstance(frame, TTSAudioRawFrame):
                self.samples, self.rate = self.samples + len(frame.audio) // 2, frame.sample_rate
            elif isinstance(frame, ErrorFrame):
                self.errors.append(frame.error)
            await self.push_frame(frame, direction)

    results = {}
    for name, tts in snippet("pipecat", url).items():
        count = Count()
        task = PipelineTask(Pipeline([tts, count]), params=PipelineParams(audio_out_sample_rate=24000))
        # a service's errors go upstream, to the task, not to the processor after it
        task.add_event_handler("on_pipeline_error", lambda _task, frame, c=count: c.errors.append(frame.error))
        await task.queue_frames([TTSSpeakFrame("".join(TEXT)), EndFrame()])
        try:
            await asyncio.wait_for(PipelineRunner(handle_sigint=False).run(task), 120)
        except Exception as e:  # noqa: BLE001 - reported as this service's result; the others still run
            count.errors.append(one_line(e))
        errors = dict.fromkeys(" ".join(str(e).split()) for e in count.errors)  # each once (the retries repeat them)
        results[name] = (count.samples / count.rate if count.rate else 0.0, count.rate,
                         *(["; ".join(errors)] if errors else []))
    return results


def main(argv: list[str]) -> int:
    url, which = argv[0], argv[1:] or ["livekit", "pipecat"]
    ok = True
    for name in which:
        for service, result in asyncio.run({"livekit": livekit, "pipecat": pipecat}[name](url)).items():
            print(f"{name} {service}: {result[0]:.2f} s at {result[1]} Hz", *result[2:])
            ok = ok and result[0] > 0 and len(result) == 2
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
