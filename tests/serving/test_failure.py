"""The error table every adapter answers from: status, kind and retry time per error class."""

from __future__ import annotations

import pytest

from ttsengine import BusyError, CancelledError, CheckpointError, ConfigError, DownloadError, InputError, MediaTypeError
from ttsengine.serving.failure import Failure, ModelFailed, ModelLoading, failure
from ttsengine.serving.network.body_limit import BodyTooLarge


@pytest.mark.parametrize("error, want", [
    (InputError("text is empty"), Failure(400, "input", "text is empty")),
    (MediaTypeError("unsupported content type"), Failure(415, "input", "unsupported content type")),
    (BodyTooLarge("request body over 9 bytes"), Failure(413, "input", "request body over 9 bytes")),
    (BusyError("the engine is busy"), Failure(503, "busy", "the engine is busy", retry_after=1)),
    (ModelLoading("loading"), Failure(503, "busy", "loading", retry_after=5)),
    (ModelFailed("the model failed to load: x"), Failure(503, "server", "the model failed to load: x")),
    (CheckpointError("bad file"), Failure(500, "server", "bad file")),
    (ConfigError("bad key"), Failure(500, "server", "bad key")),
    (DownloadError("no network"), Failure(500, "server", "no network")),
    (CancelledError("cancelled"), Failure(500, "server", "cancelled")),
    (KeyError("secret detail"), Failure(500, "server", "internal server error", expected=False)),
    (RuntimeError("boom"), Failure(500, "server", "internal server error", expected=False)),
])
def test_failure_table(error, want):
    assert failure(error) == want


def test_a_subclass_keeps_its_own_status():
    class Gone(InputError):
        status = 410

    assert failure(Gone("gone")) == Failure(410, "input", "gone")
