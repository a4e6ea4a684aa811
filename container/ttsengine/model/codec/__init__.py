"""The modded-DAC codec of S1: config, modules, encode/decode."""

from .config import CodecConfig, load_codec_config
from .dac import Codec, codec_buffer_key

__all__ = ["Codec", "CodecConfig", "codec_buffer_key", "load_codec_config"]
