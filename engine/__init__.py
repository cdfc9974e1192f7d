"""slobench's reference inference engine."""

from engine.config import EngineConfig
from engine.engine import Engine
from engine.outputs import CompletionOutput, EngineStats, RequestOutput, Timing
from engine.sampling import SamplingParams

__all__ = [
    "CompletionOutput", "Engine", "EngineConfig", "EngineStats", "RequestOutput", "SamplingParams", "Timing",
]
