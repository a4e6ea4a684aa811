"""Audio in and out: decode (any file -> mono float32), encode (chunks -> wav/pcm/mp3/opus/flac/aac), time stretch.

Imports nothing of ours but errors."""
