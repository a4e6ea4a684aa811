"""The two-engine server tests of the HTTP server and SageMaker's `serve`, run again with one engine process per
engine (TTS_ENGINE_PROCESS=on, TTS_DEVICES=cpu,cpu: serving/engine_process/process_fleet.py): routing (one stream
per engine), backpressure as the sum (busy only when every engine is full, the same message), an engine taken out of
service mid-run while the other serves, an SSE stream cut by its engine's failure, /ready and /health listing both.
The tests are the one-process ones, imported; only the environment the servers start with differs."""

from __future__ import annotations

import os

import pytest
from test_http_engines import (  # noqa: F401 - the fixture and the tests, collected again here
    server,
    test_an_engine_taken_out_of_service_leaves_the_other_serving,
    test_busy_only_when_every_engine_is_full,
    test_ready_and_health_list_both_engines,
    test_sse_cut_after_its_first_audio_ends_with_an_error_event,
    test_two_streams_run_one_on_each_engine,
)
from test_sagemaker_engines import (  # noqa: F401
    serve,
    test_an_engine_failure_fails_its_invocation_and_the_other_engine_serves_on,
    test_ping_and_two_concurrent_invocations,
)


@pytest.fixture(scope="module", autouse=True)
def engine_processes():
    """Before the module's servers start (autouse fixtures of a scope come first): they inherit os.environ."""
    os.environ["TTS_ENGINE_PROCESS"] = "on"
    yield
    os.environ.pop("TTS_ENGINE_PROCESS", None)
