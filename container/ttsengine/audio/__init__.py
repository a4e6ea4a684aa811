"""Audio in and out: decode (any file -> mono float32), encode (chunks -> wav/pcm/mp3/opus/flac/aac), time stretch,
and the encoder worker processes (encoder_pool) a stream's encoding may run in.

Imports nothing of ours but errors."""
