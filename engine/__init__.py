"""slobench's reference inference engine (the ``engine`` extra: it needs torch).

``Engine`` is imported on first use, so the plain-data modules (``engine.request.config``,
``engine.model.model_config``) import without torch: ``slobench plan`` reads the presets and ``EngineConfig``'s
defaults from them."""

from engine.request.config import EngineConfig
from engine.request.outputs import CompletionOutput, EngineStats, RequestOutput, Timing
from engine.request.sampling import SamplingParams

__all__ = [
    "CompletionOutput", "Engine", "EngineConfig", "EngineStats", "RequestOutput", "SamplingParams", "Timing",
]


def __getattr__(name: str):
    if name == "Engine":  # torch: only when asked for
        from engine.core.engine import Engine

        return Engine
    raise AttributeError(f"module 'engine' has no attribute {name!r}")
