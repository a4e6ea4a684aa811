"""Live text-in/audio-out: text arrives in pieces, is cut into segments (segmenter.py) and spoken in order
(session.py); Fish's protocol machine over any WebSocket is fish_socket.py (the HTTP server's /v1/tts/live and
SageMaker's bidirectional stream); ElevenLabs' socket lives in the HTTP adapter."""
