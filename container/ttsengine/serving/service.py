"""One boot for every adapter (HTTP, SageMaker, RunPod): load and warm the engine, in the background or in the
caller's thread, wire the stored voices to it, and say whether it is ready or why it failed.

The service owns the engine(s). Adapters submit through it and read its stats, never an engine's insides, so
one engine per GPU plugs in here without touching them: `submit` would pick an engine, `stats` and
`max_streams` would add theirs up. Errors go out through failure.py's table; the body limit is body_limit.py.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

from ..config import DownloadConfig, EngineConfig
from ..engine.engine import Engine
from ..synthesis.request import SynthesisRequest
from ..synthesis.stream import Stream
from .download import ensure_model
from .failure import ModelFailed, ModelLoading
from .voices import VoiceStore

log = logging.getLogger(__name__)
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def setup_logging(level: str) -> None:
    """The adapters' log lines: time, level, logger, message (TTS_LOG_LEVEL)."""
    logging.basicConfig(level=level.upper(), format=LOG_FORMAT)


def engine_loader(config: EngineConfig, download: DownloadConfig | None = None) -> Callable[[], Engine]:
    """-> a function that loads and warms the engine. With a model source in `download` it first fetches the
    model into config.model_dir unless that is complete (RunPod's first start on a fresh network volume)."""

    def load() -> Engine:
        if download is not None and download.model_source:
            ensure_model(config.model_dir, download.model_source, download.hf_token)
        return Engine.load(config)  # returns once warmed up

    return load


class Service:
    def __init__(self, load: Callable[[], Engine], voices_dir: Path | None):
        """load() -> a warm engine (engine_loader, or a test's factory); voices_dir: where stored voices
        live (None: this deployment has none)."""
        self._load, self.voices_dir = load, voices_dir
        self.engine: Engine | None = None
        self.voices: VoiceStore | None = None
        self.voices_error: str | None = None  # why stored voices are off although a directory was configured
        self.error: str | None = None  # why loading failed, for health checks
        self._thread: threading.Thread | None = None

    # ---- boot -----------------------------------------------------------------------------------------------
    def start(self) -> Service:
        """Loads on a background thread, so the adapter answers health checks meanwhile."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._load_logged, name="engine-loader", daemon=True)
            self._thread.start()
        return self

    def load(self) -> Service:
        """Loads in this thread (RunPod's worker, SageMaker's model_fn): returns when warm, raises what failed."""
        engine = None
        try:
            engine = self._load()
            if self.voices_dir is not None:
                try:
                    self.voices = VoiceStore(self.voices_dir, engine.voice_codes, engine.codec_tag, engine.frame_rate)
                except OSError as e:  # degrade, don't die: synthesis without stored voices is still a service
                    why = e.strerror or str(e)
                    self.voices_error = f"stored voices are disabled: {self.voices_dir} is not usable ({why})"
                    log.warning("%s; set TTS_DATA_DIR to a writable directory", self.voices_error)
        except Exception as e:
            self.error = f"{type(e).__name__}: {e}"
            if engine is not None:
                engine.close()  # its loop thread would outlive the failure
            raise
        self.engine = engine  # last: ready implies the voices are wired
        return self

    def _load_logged(self) -> None:
        try:
            self.load()
        except Exception:  # noqa: BLE001 - kept in self.error, reported by the adapter's health check
            log.exception("the engine failed to load")

    @property
    def ready(self) -> bool:
        return self.engine is not None and self.engine.ready.is_set()

    def require(self) -> Engine:
        """The engine, or ModelFailed / ModelLoading (both 503) for a request that came too early or in vain."""
        if self.error:
            raise ModelFailed(f"the model failed to load: {self.error}")
        if not self.ready:
            raise ModelLoading("the model is loading; retry shortly")
        return self.engine

    # ---- what adapters ask of the engine(s) ---------------------------------------------------------------
    def submit(self, request: SynthesisRequest) -> Stream:
        return self.require().submit(request)

    @property
    def max_streams(self) -> int:
        return self.require().max_streams

    def stats(self) -> dict | None:
        """The engine's counters, or None before it is loaded."""
        return self.engine.stats() if self.engine is not None else None

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()
