"""What the engine hands back: per-step request outputs, a finished request's timing, and engine stats."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Timing:
    """Where a request's time went, from the engine's own clock (time.monotonic())."""

    queue_ms: float
    prefill_ms: float
    decode_ms: float
    tier: str
    arrival_time: float
    first_scheduled_time: float | None
    first_token_time: float | None
    finished_time: float
    token_times: list[float] = field(default_factory=list)
    first_text_time: float | None = None  # the first output a client sees: text, or the finish

    @property
    def held_ms(self) -> float:
        """First token -> first text: the steps an incomplete character was held back (0 for most requests)."""
        if self.first_token_time is None or self.first_text_time is None:
            return 0.0
        return max(0.0, self.first_text_time - self.first_token_time) * 1e3

    def as_dict(self) -> dict:
        return {"queue_ms": round(self.queue_ms, 3), "prefill_ms": round(self.prefill_ms, 3),
                "decode_ms": round(self.decode_ms, 3), "tier": self.tier}


@dataclass
class CompletionOutput:
    index: int
    token_ids: list[int]  # everything generated so far
    text: str  # detokenized so far, stop strings trimmed, incomplete UTF-8 held back
    new_token_ids: list[int]  # generated in this step
    new_text: str
    finish_reason: str | None  # None while running, else "stop" | "length" | "abort" | "shed" | "error"


@dataclass
class RequestOutput:
    request_id: str
    tier: str
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    timing: Timing | None  # set once finished
    num_cached_tokens: int
    error: str | None = None  # the engine failed this request (and no other): why, for its client
    retry_after_s: int | None = None  # shed (429): when the engine expects room again

    @property
    def token_ids(self) -> list[int]:
        return self.outputs[0].token_ids

    @property
    def text(self) -> str:
        return self.outputs[0].text


@dataclass
class EngineStats:
    kv_usage: float
    fragmentation: float
    num_kv_blocks: int
    used_kv_blocks: int
    blocks_saved_by_sharing: int
    prefix_query_tokens: int
    prefix_hit_tokens: int
    num_running: int  # requests in the batch (vllm:num_requests_running)
    num_running_seqs: int  # their unfinished sequences (n per request): what batch slots hold
    num_waiting: int
    num_swapped: int
    batch_fill_ratio: float  # running sequences / batch slots
    num_preemptions: int  # cumulative
    num_swap_outs: int  # cumulative; preemptions that were not swaps dropped KV to recompute
    admission_rejections: dict[str, int]
    waiting_by_tier: dict[str, int]
    running_by_tier: dict[str, int]  # requests
    running_seqs_by_tier: dict[str, int]  # sequences (batch fill)
    kv_usage_by_tier: dict[str, float]  # blocks referenced by the tier's running sequences / all blocks
    estimated_queue_wait_s: dict[str, float]  # what a request of each tier arriving now would wait
    steps: int
    schedule_time_s: float  # in the scheduler, cumulative
    process_time_s: float  # sampling bookkeeping, stop checks, detokenizing, outputs, cumulative
    step_time_s: float  # whole steps, cumulative
    shed_by_tier: dict[str, int] = field(default_factory=dict)  # cumulative; also in admission_rejections
    admission_tail_factor: dict[str, float] = field(default_factory=dict)  # SLO admission's learned tail scale
