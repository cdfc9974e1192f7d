"""The engine's clocks: when each request was scheduled and got its tokens, and where each step's time went.

Everything reads time.monotonic(), so a request's queue + prefill + decode add up to its end-to-end time.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from engine.request.outputs import Timing
from engine.request.sequence import Request


def record_scheduled(request: Request, step_start: float) -> None:
    """The request's queueing ends at the start of the first step that schedules it."""
    if request.first_scheduled_time is None:
        request.first_scheduled_time = step_start


def record_token_step(request: Request, now: float) -> None:
    """The request got tokens in this step (one per sequence that sampled)."""
    if request.first_token_time is None:
        request.first_token_time = now
    request.token_times.append(now)


def request_timing(request: Request) -> Timing:
    end = request.finished_time or time.monotonic()
    scheduled = request.first_scheduled_time or end
    first = request.first_token_time or end
    return Timing(
        queue_ms=(scheduled - request.arrival_time) * 1e3,
        prefill_ms=(first - scheduled) * 1e3,
        decode_ms=(end - first) * 1e3,
        tier=request.tier,
        arrival_time=request.arrival_time,
        first_scheduled_time=request.first_scheduled_time,
        first_token_time=request.first_token_time,
        finished_time=end,
        token_times=list(request.token_times),
        first_text_time=request.first_text_time,
    )


@dataclass
class StepClock:
    """When one step's phases ended. A phase that did not run (nothing scheduled) ends when the one before did."""

    start: float = field(default_factory=time.monotonic)
    scheduled: float = 0.0
    ran: float = 0.0
    processed: float = 0.0

    def mark_scheduled(self) -> None:
        self.scheduled = self.ran = self.processed = time.monotonic()

    def mark_ran(self) -> None:
        self.ran = self.processed = time.monotonic()

    def mark_processed(self) -> None:
        self.processed = time.monotonic()


@dataclass
class StepTimes:
    """Seconds spent over all steps: scheduling, processing outputs, and whole steps (EngineStats reports them)."""

    schedule_s: float = 0.0
    process_s: float = 0.0
    step_s: float = 0.0

    def add(self, clock: StepClock) -> None:
        self.schedule_s += clock.scheduled - clock.start
        self.process_s += clock.processed - clock.ran
        self.step_s += clock.processed - clock.start
