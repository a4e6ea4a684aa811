"""Download links (Kokoro-FastAPI's `return_download_link`): the finished file of a speech request, kept for
TTS_DOWNLOAD_TTL seconds in <TTS_DATA_DIR>/downloads (serving/audio_store.py), served by GET /v1/download/{name}.

The response names the file as Kokoro does, `X-Download-Path: /download/<name>` (its clients put `/v1` in front),
and with the full path in `X-Download-URL`. A streamed response names it before the audio is made: the link
answers 404 until the stream has ended whole (a stream that fails or is abandoned keeps nothing).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse
from starlette.concurrency import run_in_threadpool

from ttsengine import CONTENT_TYPES
from ttsengine.serving.audio_store import AudioStore

from .errors import ApiError

router = APIRouter()
UNAVAILABLE = {"X-Download-Status": "unavailable"}  # Kokoro's header when no file could be kept


def link_headers(name: str) -> dict:
    return {"X-Download-Path": f"/download/{name}", "X-Download-URL": f"/v1/download/{name}"}


def keep_stream(downloads: AudioStore, fmt: str, chunks: AsyncIterator[bytes], headers: dict) -> AsyncIterator[bytes]:
    """Passes `chunks` on while writing them to a new kept file; adds its link to `headers` (sent first)."""
    pending = downloads.start(fmt) if downloads.enabled else None
    if pending is None:
        headers.update(UNAVAILABLE)
        return chunks
    headers.update(link_headers(pending.name))

    async def tee() -> AsyncIterator[bytes]:
        whole = False
        try:
            async for data in chunks:
                pending.write(data)
                yield data
            await asyncio.to_thread(pending.finish)
            whole = True
        finally:
            if not whole:  # failed or abandoned: keep nothing, and stop the generation (audio_bytes cancels)
                pending.discard()
                await chunks.aclose()

    return tee()


async def keep_whole(downloads: AudioStore, fmt: str, data: bytes) -> dict:
    """Keeps a finished file; -> the headers that link it (or say it could not be kept: over the size bound)."""
    if not downloads.enabled or len(data) > downloads.max_bytes:
        return UNAVAILABLE

    def write() -> str | None:
        pending = downloads.start(fmt)
        if pending is None:
            return None
        pending.write(data)
        pending.finish()
        return pending.name if pending.kept else None

    name = await run_in_threadpool(write)
    return UNAVAILABLE if name is None else link_headers(name)


@router.get("/v1/download/{name}", tags=["speech"], responses={200: {"content": {"audio/mpeg": {}}}})
async def download(name: str, request: Request):
    """A file kept by `return_download_link`; open (the random name is the credential), for TTS_DOWNLOAD_TTL s."""
    downloads = request.app.state.downloads
    path = downloads.path(name)  # the store's index: no disk access, no thread
    stat = None
    if path is not None:
        try:
            stat = await run_in_threadpool(os.stat, path)
        except FileNotFoundError:  # deleted behind the server's back
            downloads.forget(name)
    if stat is None:
        why = downloads.why_missing(name) or ("unknown, expired (links last TTS_DOWNLOAD_TTL seconds) or not "
                                              "finished yet")
        raise ApiError(404, f"no download {name[:80]!r}: {why}")
    fmt = path.suffix[1:]
    return FileResponse(path, media_type=CONTENT_TYPES[fmt], filename=f"speech.{fmt}", stat_result=stat,
                        headers={"Cache-Control": "no-store"})
