"""A sequence (one of a request's n completions) and the request that groups them."""

from __future__ import annotations

import enum
import itertools
import time
from dataclasses import dataclass, field

import torch

from engine.request.sampling import SamplingParams

_seq_ids = itertools.count()


class SeqStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    SWAPPED = "swapped"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    request_id: str
    index: int  # which of the request's n completions
    token_ids: list[int]  # prompt followed by generated tokens
    num_prompt_tokens: int
    params: SamplingParams
    tier: str
    arrival_time: float
    seq_id: int = field(default_factory=lambda: next(_seq_ids))
    status: SeqStatus = SeqStatus.WAITING
    num_computed: int = 0  # tokens whose K/V are in the cache
    num_cached_prefix: int = 0  # of those, tokens that came from the prefix cache
    finish_reason: str | None = None
    generator: torch.Generator | None = None
    last_scheduled_step: int = -1
    # Detokenization state: text so far (stop strings trimmed) and the incremental decoding window.
    text: str = ""
    prefix_offset: int = 0
    read_offset: int = 0
    num_emitted_tokens: int = 0
    emitted_text_len: int = 0

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def num_uncomputed(self) -> int:
        return self.num_tokens - self.num_computed

    @property
    def is_finished(self) -> bool:
        return self.status is SeqStatus.FINISHED


@dataclass(eq=False)
class Request:
    """What a client asked for: a prompt, its parameters, and the n sequences generating for it."""

    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    tier: str
    arrival_time: float = field(default_factory=time.monotonic)
    order: int = 0  # arrival order at the scheduler: breaks ties of arrival_time in the rank
    seqs: list[Sequence] = field(default_factory=list)
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    first_text_time: float | None = None  # its first output a client can see: text, or the finish
    finished_time: float | None = None
    token_times: list[float] = field(default_factory=list)  # arrival of each step's tokens
    sheddable: bool = True  # SLO-aware admission may shed it while queued (not offline work: generate())
    parent_id: str | None = None  # one of the n children of a request too wide for the batch (engine/core/fanout.py)
    child_index: int = 0  # which of the parent's n completions this child is (its sequence's index)
    error: str | None = None  # why the engine failed it (finish_reason "error"), for its client only
    retry_after_s: int | None = None  # shed: when the engine expects room for it again

    @property
    def is_finished(self) -> bool:
        return bool(self.seqs) and all(s.is_finished for s in self.seqs)
