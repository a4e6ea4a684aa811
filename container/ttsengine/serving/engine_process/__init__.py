"""The engine in its own process (TTS_ENGINE_PROCESS): the adapters' process keeps the event loop, the HTTP
parsing and the encoders; the engine process keeps the engine loop and the codec thread, so per-stream Python
work in the front never takes the GIL the decode loop needs (issue 43's breakdown: 3x the engine's host time per
frame with 256 HTTP streams in one process).

wire.py: the messages between the two; host.py: the engine side (python -m ttsengine.serving.engine_process.host);
remote_fleet.py: the front side, a Fleet look-alike the Service holds like the in-process one.
"""
