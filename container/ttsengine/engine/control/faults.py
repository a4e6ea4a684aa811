"""When an engine gives up: which step failures end it (the device is lost) and which it survives.

A failed step fails the streams it was running and the engine goes on (a bad input that slipped through,
a transient OOM). Some errors leave the CUDA context unusable (an illegal address, a device-side assert,
an ECC error: "sticky" errors that every later call repeats); and a failure that repeats step after step
means the same. Then the engine is taken out of service: its requests get an error, the front routes
around it, health checks report it.
"""

from __future__ import annotations

from dataclasses import dataclass

# what torch puts in the message of an error that poisons the CUDA context
STICKY = ("CUDA error", "device-side assert", "illegal memory access", "illegal instruction",
          "unspecified launch failure", "uncorrectable ECC", "CUBLAS_STATUS_EXECUTION_FAILED",
          "CUDNN_STATUS_EXECUTION_FAILED", "device lost")
MAX_CONSECUTIVE = 3  # failed iterations in a row without one that succeeded


def sticky(error: BaseException) -> bool:
    """The error leaves the device unusable for this process (torch >= 2.8 raises AcceleratorError for those)."""
    if type(error).__name__ == "AcceleratorError":
        return True
    text = str(error)
    return any(marker in text for marker in STICKY)


@dataclass
class FaultCounter:
    consecutive: int = 0

    def failed(self, error: BaseException) -> str | None:
        """-> why the engine must stop (None: fail the streams and go on)."""
        self.consecutive += 1
        if sticky(error):
            return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
        if self.consecutive >= MAX_CONSECUTIVE:
            return f"{self.consecutive} engine steps failed in a row, the last with {type(error).__name__}: {error}"
        return None

    def succeeded(self) -> None:
        self.consecutive = 0


def simulated(device: str) -> RuntimeError:
    """What the TTS_TEST_FAIL_ENGINE hook raises: a sticky error, as a lost GPU would give."""
    return RuntimeError(f"CUDA error: an illegal memory access was encountered (simulated on {device} by "
                        "TTS_TEST_FAIL_ENGINE)")
