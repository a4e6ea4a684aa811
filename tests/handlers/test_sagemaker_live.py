"""SageMaker's bidirectional stream (InvokeEndpointWithBidirectionalStream, issue 45) at the container: SageMaker's
sidecar opens a WebSocket to `serve` at /invocations-bidirectional-stream and passes each payload part as one
message; Fish's live protocol runs there as on the HTTP server's /v1/tts/live. The real `serve` on the tiny model,
a plain WebSocket client standing where the sidecar stands (the HTTP/2 client side and the sidecar itself can only
be tried on a real endpoint)."""

from __future__ import annotations

import pytest
from conftest import ROOT
from test_drain import start_serve
from test_live import error_close, receive, send, start, until_finish
from websockets.sync.client import connect


@pytest.fixture(scope="module")
def serve(tmp_path_factory):
    proc, url = start_serve(tmp_path_factory.mktemp("bidi"), TTS_DEFAULT_MAX_NEW_TOKENS="8",
                            TTS_LIVE_IDLE_TIMEOUT="5")
    yield url
    proc.terminate()
    proc.wait(30)


def stream(url: str):
    return connect(url.replace("http://", "ws://") + "/invocations-bidirectional-stream", open_timeout=10)


def test_a_live_session_over_the_bidirectional_stream(serve):
    with stream(serve) as ws:  # no key: SageMaker authenticates the caller (SigV4) before the sidecar connects
        # the client offers permessage-deflate; serve declines it as http does (feature plain_websocket)
        assert ws.response.headers.get("Sec-WebSocket-Extensions") is None
        start(ws)
        send(ws, event="text", text="Hello there. How are")
        send(ws, event="text", text=" you today?")
        send(ws, event="stop")
        pcm, finish = until_finish(ws)
        assert finish == {"event": "finish", "reason": "stop"}
        assert len(pcm) > 0 and len(pcm) % 2 == 0
        start(ws, text="A second session on the same stream.")  # one stream, many turns
        send(ws, event="stop")
        pcm, finish = until_finish(ws)
        assert finish["reason"] == "stop" and len(pcm) > 0


def test_bad_messages_end_the_stream_with_a_reason(serve):
    with stream(serve) as ws:
        ws.send("a text part, not msgpack")  # a UTF-8 payload part arrives as a text message
        event, code, reason = error_close(ws)
        assert code == 1007 and "msgpack maps in binary messages" in event["message"] and reason
    with stream(serve) as ws:
        send(ws, event="text", text="no start")
        event, code, _ = error_close(ws)
        assert code == 1008 and "'text' before `start`" in event["message"]


def test_closing_the_stream_is_barge_in_and_serve_keeps_serving(serve):
    with stream(serve) as ws:
        start(ws, max_new_tokens=2000)
        send(ws, event="text", text="Long. " * 20)
        assert receive(ws)["event"] == "audio"
    with stream(serve) as ws:  # the next stream is served at once
        start(ws, text="After the barge-in.")
        send(ws, event="stop")
        assert until_finish(ws)[1]["reason"] == "stop"


def test_the_image_says_it_takes_bidirectional_streams():
    # SageMaker opens the socket only for images with this label
    assert "LABEL com.amazonaws.sagemaker.capabilities.bidirectional-streaming=true" in \
        (ROOT / "Dockerfile").read_text()
