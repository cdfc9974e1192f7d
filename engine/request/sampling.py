"""A request's sampling parameters, validated at their numerical edges; engine/model/sampler.py draws tokens by them.

The ranges are vLLM's (`vllm.SamplingParams._verify_args`): a value outside them raises ValueError whose message
starts with the field's name (the server answers 400 naming it). NaN and the infinities are refused everywhere;
a positive temperature below `MIN_TEMPERATURE` is raised to it, as vLLM does, since dividing logits by a
denormal overflows them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

MIN_TEMPERATURE = 1e-2  # vLLM's _MAX_TEMP: smaller positive temperatures are raised to it
PENALTY_RANGE = (-2.0, 2.0)  # presence and frequency penalties (vLLM, OpenAI)
LOGIT_BIAS_RANGE = (-100.0, 100.0)  # OpenAI's range for a logit_bias value


def _finite(name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")


@dataclass
class SamplingParams:
    n: int = 1
    max_tokens: int = 16
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: off
    min_p: float = 0.0  # 0: off; else drop tokens less likely than min_p x the likeliest one
    presence_penalty: float = 0.0  # minus this from a token's logit once it is in the output
    frequency_penalty: float = 0.0  # minus this times its count in the output
    repetition_penalty: float = 1.0  # a token of the prompt or output: positive logits / it, negative x it
    logit_bias: dict[int, float] = field(default_factory=dict)  # token id -> added to its logit
    seed: int | None = None
    stop: list[str] = field(default_factory=list)  # stop strings, matched on the decoded text
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    min_tokens: int = 0

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError("n must be at least 1")
        if self.max_tokens < 1:
            raise ValueError("max_tokens must be at least 1")
        for name in ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty"):
            _finite(name, getattr(self, name))
        if self.temperature < 0:
            raise ValueError("temperature must be non-negative")
        if 0 < self.temperature < MIN_TEMPERATURE:
            self.temperature = MIN_TEMPERATURE
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError("top_p must be in (0, 1]")
        if self.top_k < -1:
            raise ValueError("top_k must be -1, 0 (off) or positive")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError("min_p must be in [0, 1]")
        for name in ("presence_penalty", "frequency_penalty"):
            if not PENALTY_RANGE[0] <= getattr(self, name) <= PENALTY_RANGE[1]:
                raise ValueError(f"{name} must be in [{PENALTY_RANGE[0]}, {PENALTY_RANGE[1]}]")
        if self.repetition_penalty <= 0:
            raise ValueError("repetition_penalty must be greater than 0")
        for token, bias in self.logit_bias.items():
            _finite("logit_bias", bias)
            if not LOGIT_BIAS_RANGE[0] <= bias <= LOGIT_BIAS_RANGE[1] or token < 0:
                raise ValueError(f"logit_bias values must be in [-100, 100], got {bias} for token {token}")
        if self.min_tokens < 0 or self.min_tokens > self.max_tokens:
            raise ValueError("min_tokens must be between 0 and max_tokens")
        if isinstance(self.stop, str):
            self.stop = [self.stop]

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def penalized(self) -> bool:
        """Any of the three penalties is on."""
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0)
