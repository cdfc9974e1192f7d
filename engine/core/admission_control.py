"""The engine's admission: a request accepted or refused (HTTP 429) as it arrives, a queued one shed once it
can no longer keep its promise, and the per-tier counts the estimate reads.

`AdmissionControl` is what `Engine` holds and calls: `admit` at arrival (from any thread, under the engine's
inbox lock), `entered_inbox` / `left_inbox` as an accepted request waits for the engine thread, and, on the
engine thread, `late_requests` / `on_shed` before each step, `on_step` after it, `on_first_text` and
`on_finished` as requests show their first text and finish. The estimate itself (queue wait, TTFT, the
tail factor) is engine/core/admission.py's `AdmissionEstimator`.
"""

from __future__ import annotations

from engine.core.admission import AdmissionEstimator, QueueSnapshot
from engine.core.fanout import FanOut
from engine.request.admission_constants import QUEUE_BOUND_MARGIN_S
from engine.request.config import EngineConfig
from engine.request.errors import QueueFullError, SLOUnattainableError
from engine.request.sequence import Request
from engine.request.tiers import TIERS
from engine.scheduler.scheduler import ScheduledSeq, Scheduler


class AdmissionControl:
    """Accepts or refuses requests, picks the queued ones to shed, and keeps the counts behind both."""

    def __init__(self, config: EngineConfig, scheduler: Scheduler, fanout: FanOut):
        self.config = config
        self.scheduler = scheduler
        self.fanout = fanout
        self.estimator = AdmissionEstimator(config, {t: scheduler.slot_limit(t) for t in TIERS})
        # accepted, still in the engine's inbox (the scheduler counts them once the engine thread takes them)
        self.inbox_requests = dict.fromkeys(TIERS, 0)
        self.inbox_slots = dict.fromkeys(TIERS, 0)  # batch slots (n per request)
        self.inbox_tokens = dict.fromkeys(TIERS, 0)  # prompt tokens
        # after the last step: batch slots held, and the prompt tokens still to prefill of requests in the batch
        self.running_slots = dict.fromkeys(TIERS, 0)
        self.running_prefill = dict.fromkeys(TIERS, 0)
        self.rejections = dict.fromkeys(TIERS, 0)  # every 429: at arrival, and shed later
        self.num_shed = dict.fromkeys(TIERS, 0)  # queued requests shed: they could no longer keep their promise

    # ---- at arrival (any thread, under the engine's inbox lock) ----------------------------------
    def admit(self, tier: str, prompt_tokens: int, slo_admission: bool) -> None:
        """Accept a request of `tier`, or refuse it (429).

        Refused when its tier's queue is full (QueueFullError) or, under SLO admission (`slo_admission`: not
        offline work), when it would queue past its tier's TTFT promise (SLOUnattainableError).
        """
        limit = self.config.max_waiting_per_tier.get(tier, 0)
        try:
            if self.scheduler.num_waiting(tier) + self.inbox_requests[tier] >= limit:
                raise QueueFullError(tier, limit, self.retry_after_s(tier))
            if slo_admission:
                self.estimator.check(tier, prompt_tokens, self.snapshot())
        except (QueueFullError, SLOUnattainableError):
            self.rejections[tier] += 1
            raise
        self.estimator.on_admitted(tier, prompt_tokens)

    def entered_inbox(self, request: Request) -> None:
        self.inbox_requests[request.tier] += 1
        self.inbox_slots[request.tier] += request.params.n
        self.inbox_tokens[request.tier] += len(request.prompt_ids)

    def left_inbox(self, request: Request) -> None:
        """The engine thread took it: the scheduler's queues count it now."""
        self.inbox_requests[request.tier] -= 1
        self.inbox_slots[request.tier] -= request.params.n
        self.inbox_tokens[request.tier] -= len(request.prompt_ids)

    def snapshot(self) -> QueueSnapshot:
        """What is queued per tier, in the scheduler and the inbox (any thread; reads counters only)."""
        queues = self.scheduler.queues
        return QueueSnapshot(
            queued_slots={t: queues.queued_slots[t] + self.inbox_slots[t] for t in TIERS},
            queued_tokens={t: queues.queued_tokens[t] + self.inbox_tokens[t] + self.running_prefill[t]
                           for t in TIERS},
            running_slots=dict(self.running_slots),
            kv_blocked_tier=self.scheduler.kv_blocked_tier,
        )

    def retry_after_s(self, tier: str) -> int:
        """The Retry-After of a 429 to a request of `tier`: its queue's estimated wait, in whole seconds."""
        return self.estimator.retry_after_s(tier, self.snapshot())

    # ---- while requests queue (the engine thread) ------------------------------------------------
    def shed_deadline_s(self, tier: str, request: Request) -> float | None:
        """How long it may wait unstarted: its promise (SLO admission) or its tier's longest wait, the sooner."""
        prompt = len(request.prompt_ids)
        slo = self.estimator.shed_deadline_s(tier, prompt) if self.config.admission == "slo" else None
        bound = self.config.tier_max_queue_s.get(tier)
        if bound is not None:
            # Its first text, not only its start, within the bound as its client sees it: less its own steps,
            # and a margin for the step that notices it and the HTTP path (the overload bench's basic requests
            # overshot a 60 s bound by up to 0.2 s without it).
            bound -= self.estimator.own_steps_s(prompt) + min(QUEUE_BOUND_MARGIN_S, 0.1 * bound)
        return min((d for d in (slo, bound) if d is not None), default=None)

    def late_requests(self, tier: str, now: float) -> list[Request]:
        """The queued requests of `tier` to shed at `now`: never started, and past their promise
        (engine/core/admission.py) or their tier's longest wait (`tier_max_queue_s`)."""
        queues = self.scheduler.queues
        late: list[Request] = []
        # waiting and swapped, each in arrival order within the tier: stop at the first that still has time
        for queue in (queues.waiting[tier], queues.swapped[tier]):
            for request in queue:
                deadline = self.shed_deadline_s(tier, request)
                if deadline is None or now - request.arrival_time <= deadline:
                    break
                # One the client has seen output of keeps its place: its answer is under way. One preempted
                # before its first text (a byte-level model holds back an incomplete character) has shown
                # nothing yet, and would otherwise wait out the tiers above it with its first token unsent.
                group = self.fanout.group_of(request)
                if request.first_text_time is None and request.sheddable and not (group and group.started):
                    late.append(request)
        return late

    def on_shed(self, tier: str) -> None:
        """A request of `tier` was shed: a 429 like the others, only later."""
        self.num_shed[tier] += 1
        self.rejections[tier] += 1
        self.estimator.on_outcome(tier, None)  # admitted and then past hope: admission was too lenient

    # ---- what the engine measures (the engine thread) --------------------------------------------
    def on_step(self, batch: list[ScheduledSeq], step_s: float) -> None:
        """A step ended: its time and prefill tokens (when it ran the model), and the batch slots now held."""
        if batch:
            decodes = sum(1 for item in batch if item.num_new_tokens == 1 and item.seq.num_output_tokens > 1)
            self.estimator.on_step(step_s, sum(item.num_new_tokens for item in batch) - decodes)
        slots = dict.fromkeys(TIERS, 0)
        prefill = dict.fromkeys(TIERS, 0)  # joined, not yet prefilled: a new request queues behind it too
        for request in self.scheduler.running:
            slots[request.tier] += request.params.n
            if request.first_token_time is None and request.seqs:
                prefill[request.tier] += max(0, len(request.prompt_ids) - request.seqs[0].num_computed)
        self.running_slots, self.running_prefill = slots, prefill

    def on_first_text(self, request: Request, now: float) -> None:
        """It showed its client its first text: under SLO admission, the tail factor learns what it got."""
        if request.sheddable:
            self.estimator.on_outcome(request.tier, now - request.arrival_time)

    def on_finished(self, request: Request, now: float) -> None:
        """A request finished: one that ran to its end (not aborted, not failed) gives a residence sample."""
        if request.first_scheduled_time is not None and all(s.finish_reason not in ("abort", "error")
                                                            for s in request.seqs):
            self.estimator.on_finished(now - request.first_scheduled_time)
