"""loadtest's raw HTTP/1.1 client (tools/load/raw_http.py) against a real asyncio server that answers the ways an
HTTP server may: chunked with a trailer, Content-Length, a body to the connection's end, an error with a body, a
kept connection closed by the server between requests, and a broken answer."""

from __future__ import annotations

import asyncio
import json

import pytest

from ttsengine.tools.load.raw_http import ProtocolError, RawClient

ANSWERS = {
    "/chunked": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-Sample-Rate: 44100\r\n\r\n"
                b"5\r\nhello\r\n1;ext=1\r\n \r\n5\r\nworld\r\n0\r\nX-Trailer: 1\r\n\r\n",
    "/length": b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\nRetry-After: 1\r\n\r\nbusy",
    "/to-end": b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nall of it",
    "/broken": b"HTCPCP/1.0 418\r\n\r\n",
    "/bad-chunk": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
}


async def _serve(seen: list, close_after: int):
    """One request per read; the answer by path; the connection closed after `close_after` answers (keep-alive
    cut by the server) or when the answer says so."""

    async def handle(reader, writer):
        answered = 0
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                break
            lines = head.decode().split("\r\n")
            headers = dict(line.split(": ", 1) for line in lines[1:] if line)
            body = await reader.readexactly(int(headers.get("Content-Length", 0)))
            path = lines[0].split(" ")[1].split("?")[0]
            seen.append((lines[0], headers, body))
            writer.write(ANSWERS[path])
            await writer.drain()
            answered += 1
            if answered >= close_after or path == "/to-end":
                break
        writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0)


def _run(close_after: int, steps):
    seen: list = []

    async def main():
        server = await _serve(seen, close_after)
        port = server.sockets[0].getsockname()[1]
        try:
            async with RawClient(f"http://127.0.0.1:{port}", timeout=5) as client:
                return [await step(client, f"http://127.0.0.1:{port}") for step in steps]
        finally:
            server.close()

    return asyncio.run(main()), seen


async def _get(client, url, path, **kw):
    async with client.stream("POST", url + path, **kw) as r:
        return r.status_code, r.headers, [part async for part in r.aiter_raw()]


def test_chunked_length_and_to_end_bodies_arrive_whole_over_kept_connections():
    async def chunked(client, url):
        return await _get(client, url, "/chunked?x=1", json={"input": "hi"}, headers={"Authorization": "Bearer k"})

    async def length(client, url):
        async with client.stream("POST", url + "/length") as r:
            return r.status_code, r.headers, await r.aread()

    async def to_end(client, url):
        return await _get(client, url, "/to-end")

    (a, b, c, d), seen = _run(close_after=10, steps=[chunked, length, chunked, to_end])
    assert a[0] == 200 and b"".join(a[2]) == b"hello world" and a[1]["x-sample-rate"] == "44100"
    assert b == (503, b[1], b"busy") and b[1]["retry-after"] == "1"
    assert b"".join(c[2]) == b"hello world"
    assert d[0] == 200 and b"".join(d[2]) == b"all of it"
    line, headers, body = seen[0]
    assert line == "POST /chunked?x=1 HTTP/1.1" and headers["Authorization"] == "Bearer k"
    assert json.loads(body) == {"input": "hi"} and headers["Content-Type"] == "application/json"
    assert len(seen) == 4


def test_a_kept_connection_the_server_closed_is_replaced_once():
    async def chunked(client, url):
        return b"".join((await _get(client, url, "/chunked"))[2])

    results, seen = _run(close_after=1, steps=[chunked, chunked, chunked])
    assert results == [b"hello world"] * 3 and len(seen) == 3


@pytest.mark.parametrize("path", ["/broken", "/bad-chunk"])
def test_a_broken_answer_is_a_protocol_error(path):
    async def broken(client, url):
        with pytest.raises(ProtocolError):
            await _get(client, url, path)
        return True

    assert _run(close_after=10, steps=[broken])[0] == [True]


def test_only_http_urls():
    with pytest.raises(ValueError, match="not an http"):
        RawClient("ftp://x", 1)
