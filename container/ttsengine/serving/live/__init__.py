"""Live text-in/audio-out: text arrives in pieces, is cut into segments (segmenter.py) and spoken in order
(session.py); the WebSocket protocols that drive it live in the adapters."""
