"""Whether TTS_FEATURES leaves an adapter-side feature on. The adapters may not import the engine's feature registry
(DESIGN.md's import rules: they use the package root and ttsengine.serving), so they ask here, by function."""

from __future__ import annotations

from ..engine import features as feature_names


def runpod_coalesce(features: str) -> bool:
    """A RunPod worker's streamed job sends all the audio made since its last item as one (serving/coalesce.py)."""
    return not feature_names.switched_off(features, feature_names.RUNPOD_COALESCE)


def runpod_pickup(features: str) -> bool:
    """A RunPod worker starts each job as soon as the SDK fetched it (handlers/runpod/pickup.py)."""
    return not feature_names.switched_off(features, feature_names.RUNPOD_PICKUP)
