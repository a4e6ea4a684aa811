"""A clean stop for the HTTP adapters (`http` and SageMaker's `serve`): on SIGTERM or SIGINT the server keeps
listening while it drains (new requests 503 with Retry-After, /ready and /ping 503, so a load balancer moves
away), the requests in flight get up to TTS_DRAIN_SECONDS to finish, then whatever is left is cut so its client
can tell (an aborted chunked body for raw audio, an error event for SSE, a JSON 503 for a whole file), and only
then does uvicorn stop. A second signal cuts at once.

uvicorn's own graceful shutdown stops listening first and then cuts open responses after its timeout in a way
a WAV or PCM client cannot tell from the end of the audio; this runs before it.
"""

from __future__ import annotations

import functools
import logging
import threading

from ...engine import features as feature_names
from ..service import Service
from .connection_guard import ConnectionGuard, Deadlines

log = logging.getLogger(__name__)
FLUSH_SECONDS = 10  # after the drain: for the last bytes of finished responses to go out
NEVER = 365 * 86400  # uvicorn's keep-alive has no "off"; TTS_IDLE_TIMEOUT=0 asks for one


def serve(app, service: Service, host: str, port: int, log_level: str, drain_seconds: int,
          deadlines: Deadlines, features: str = "auto") -> None:
    """uvicorn.run(app, ...) with the drain above, each connection under `deadlines` (connection_guard.py);
    features: TTS_FEATURES (plain_websocket: WebSockets without permessage-deflate)."""
    import uvicorn
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    class DrainingServer(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:
            # the signal handler, on the event loop's thread: it must return at once (the engines' threads end the
            # streams, and their clients are served by this loop)
            seconds = 0 if getattr(self, "_draining", False) else drain_seconds
            self._draining = True
            if seconds:
                log.warning("signal %d: draining for up to %d s (a second signal cuts at once)", sig, seconds)
            threading.Thread(target=self._stop, args=(sig, frame, seconds), daemon=True, name="drain").start()

        def _stop(self, sig, frame, seconds: int) -> None:
            service.drain(seconds)
            service.close()  # what is left ends with ShuttingDown (503)
            super().handle_exit(sig, frame)  # sets uvicorn's exit flags; its main loop polls them

    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=FLUSH_SECONDS,
                            http=functools.partial(ConnectionGuard, AutoHTTPProtocol, deadlines),
                            timeout_keep_alive=deadlines.idle or NEVER,
                            ws_per_message_deflate=websocket_deflate(features))
    DrainingServer(config).run()


def websocket_deflate(features: str) -> bool:
    """Whether the WebSockets accept a client's offer of permessage-deflate: only with plain_websocket switched off.
    Audio barely compresses, and each message would be deflated on the event loop every socket is served by."""
    return feature_names.switched_off(features, feature_names.PLAIN_WEBSOCKET)
