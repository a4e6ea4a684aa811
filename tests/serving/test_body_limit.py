"""The ASGI body limit on its own: a stand-in app, messages fed by hand, no server."""

from __future__ import annotations

import asyncio
import json

from ttsengine.serving.network.body_limit import BodyLimit, BodyTooLarge


def run(limit: int, chunks: list[bytes], length: int | None = None, app=None) -> tuple[list[dict], list[bytes]]:
    """-> (the messages the client got, the body chunks the app read)."""
    sent, read = [], []
    incoming = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]

    async def receive():
        return incoming.pop(0)

    async def send(message):
        sent.append(message)

    async def echo(scope, receive, send):
        more = True
        while more:
            message = await receive()
            read.append(message["body"])
            more = message.get("more_body", False)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    headers = [] if length is None else [(b"content-length", str(length).encode())]
    scope = {"type": "http", "method": "POST", "path": "/", "headers": headers}
    limited = BodyLimit(app or echo, limit, reply=lambda e: {"error": {"message": str(e), "code": e.status}})
    asyncio.run(limited(scope, receive, send))
    return sent, read


def status_and_body(sent: list[dict]) -> tuple[int, dict | bytes]:
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    start = next(m for m in sent if m["type"] == "http.response.start")
    return start["status"], json.loads(body) if start["status"] != 200 else body


def test_under_the_limit_passes_through():
    sent, read = run(10, [b"12345", b"67890"], length=10)
    assert status_and_body(sent) == (200, b"ok") and read == [b"12345", b"67890"]


def test_content_length_over_the_limit_is_refused_before_reading():
    sent, read = run(10, [b"x" * 11], length=11)
    assert status_and_body(sent) == (413, {"error": {"message": "request body over 10 bytes", "code": 413}})
    assert read == []


def test_a_body_of_unknown_length_is_cut_off_while_it_arrives():
    sent, read = run(10, [b"x" * 6, b"x" * 6, b"x" * 6])
    assert status_and_body(sent)[0] == 413 and read == [b"x" * 6]


def test_an_app_that_answers_the_error_itself_is_left_alone():
    async def answering(scope, receive, send):
        try:
            await receive()
        except BodyTooLarge as e:  # an adapter's error handling turns it into its own 413
            await send({"type": "http.response.start", "status": e.status, "headers": []})
            await send({"type": "http.response.body", "body": b'{"own": true}'})

    sent, _ = run(3, [b"toolong"], app=answering)
    assert status_and_body(sent) == (413, {"own": True}) and len(sent) == 2


def test_other_scopes_pass_through():
    seen = []

    async def app(scope, receive, send):
        seen.append(scope["type"])

    asyncio.run(BodyLimit(app, 1, reply=dict)({"type": "lifespan"}, None, None))
    assert seen == ["lifespan"]


def test_a_stalled_body_gets_408_and_a_finished_one_may_wait_for_its_disconnect():
    async def scenario(body_complete: bool):
        sent = []
        calls = 0

        async def receive():
            nonlocal calls
            calls += 1
            if calls == 1:
                return {"type": "http.request", "body": b"part", "more_body": not body_complete}
            await asyncio.sleep(0.5)  # longer than the read timeout
            return {"type": "http.disconnect"}

        async def send(message):
            sent.append(message)

        async def app(scope, receive, send):
            first = await receive()
            if first.get("more_body"):
                await receive()  # the stalled rest of the body
            await send({"type": "http.response.start", "status": 200, "headers": []})
            assert (await receive())["type"] == "http.disconnect"  # a streaming response's wait: no timeout
            await send({"type": "http.response.body", "body": b"ok"})

        limited = BodyLimit(app, 100, reply=lambda e: {"error": {"message": str(e), "code": e.status}},
                            read_timeout=0.1)
        await limited({"type": "http", "method": "POST", "path": "/", "headers": []}, receive, send)
        return sent

    stalled = asyncio.run(scenario(body_complete=False))
    assert status_and_body(stalled) == (408, {"error": {"message": "the request body stalled for 0.1 s", "code": 408}})
    finished = asyncio.run(scenario(body_complete=True))
    assert status_and_body(finished) == (200, b"ok")


def trickled(pieces: int, every: float, **limits) -> tuple[list[dict], float]:
    """A body of `pieces` 100-byte pieces, one every `every` seconds, read by an app that echoes it -> (what the
    client got, seconds until the answer)."""
    async def scenario():
        sent, n = [], 0

        async def receive():
            nonlocal n
            await asyncio.sleep(every)
            n += 1
            return {"type": "http.request", "body": b"x" * 100, "more_body": n < pieces}

        async def send(message):
            sent.append(message)

        async def app(scope, receive, send):
            while (await receive()).get("more_body"):
                pass
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})

        limited = BodyLimit(app, 1 << 20, reply=lambda e: {"error": {"message": str(e), "code": e.status}}, **limits)
        t0 = asyncio.get_running_loop().time()
        await limited({"type": "http", "method": "POST", "path": "/", "headers": []}, receive, send)
        return sent, asyncio.get_running_loop().time() - t0

    return asyncio.run(scenario())


def test_a_body_under_the_minimum_rate_gets_408_after_the_grace_and_its_connection_closes():
    sent, seconds = trickled(100, 0.05, min_rate=4000, rate_grace=0.3)  # 2,000 B/s: never pauses 30 s
    status, body = status_and_body(sent)
    assert status == 408 and 0.3 <= seconds < 0.6, seconds
    assert body["error"]["message"].startswith("the request body arrived at ") and "under 4000 bytes/s" in \
        body["error"]["message"]
    assert (b"connection", b"close") in sent[0]["headers"]


def test_a_body_over_the_minimum_rate_is_read_and_the_limits_switch_off_with_0():
    assert status_and_body(trickled(10, 0.05, min_rate=500, rate_grace=0.1)[0]) == (200, b"ok")  # 2,000 B/s
    assert status_and_body(trickled(10, 0.05, min_rate=0, body_timeout=0)[0]) == (200, b"ok")


def test_a_body_that_takes_longer_than_the_body_timeout_gets_408():
    sent, seconds = trickled(100, 0.05, body_timeout=0.3)
    assert status_and_body(sent) == (408, {"error": {"message": "the request body took longer than 0.3 s",
                                                     "code": 408}})
    assert 0.3 <= seconds < 0.6
