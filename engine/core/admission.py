"""SLO-aware admission's estimate: each tier's queue wait, from the engine's measured service rate.

`AdmissionEstimator` estimates and decides; engine/core/admission_control.py's `AdmissionControl` holds it for
the engine, with the counts of what is queued and running.

The engine thread feeds exponentially weighted moving averages (EWMA):

- slot turnover: each finished request's residence R (first scheduled -> finished, preemptions included);
  with L batch slots occupied, slots free at mu = L / mean(R) per second (Little's law);
- prefill rate rho: prompt tokens computed per second of step time, over windows of steps that prefilled;
- step time s: the wall time of a step that ran the model.

A new request of tier T waits behind what is queued at T's rank or above (the premium queue for premium;
premium and standard for standard; everything for basic), counted in the scheduler's queues and the
engine's inbox: S slots (n per request) and K prefill tokens (requests in the batch not yet prefilled count
too: the burst that just joined it is still ahead). F = the batch slots free to T (its slot limit minus
those held by tiers at or above it: lower tiers are preempted for it), and the occupancy the queue will run
at, L = min(slot limit, slots running + S). When requests last stopped joining the batch for lack of KV at
T's rank or above, free slots do not help: F = 0 and L = the slots running. Then

    mu = L / mean(R),  wait(T) = max(max(0, S - F) / (mu - lambda_above), K / (rho - lambda_above * p_above))

where lambda_above is the admitted arrival rate of the tiers above T and p_above their mean prompt length:
they keep arriving and are served first, so only what they leave serves T's queue (a rate left <= 0 gives an
infinite wait: T is refused while they saturate the engine; a rate with no sample yet gives 0).
    TTFT estimate = wait(T) + s * (1 + its own prefill steps)        (the step under way, then its chunks)

The estimate is a typical wait, but a promise is a tail (p99): requests also queue behind bursts, a long
prompt's chunks, a first character held back over several steps (a byte-level model). So each tier's estimate
is scaled by a tail factor k learned from what the accepted requests got: every request's own TTFT in the
engine (arrival -> its first text) that passes the target, and every request shed, raises k by
exp(TAIL_STEP * 0.99); every one within it lowers k by exp(TAIL_STEP * 0.01). That is a stochastic
approximation of a quantile (Robbins-Monro): k settles where 1 % of the accepted requests miss the target,
tightening admission while the tail misses and loosening it again when the engine keeps up. The factor
describes one busy period: once the engine has had nothing running or queued for `IDLE_FORGET_S`, the next
request finds k back at 1 (the factor matters only while requests queue, when the engine is never idle;
slobench's steps start from an idle target, at least 0.2 s after its last step). Kept, an overload's k (2
after a burst of misses) would refuse at a load the engine carries for the next thousand requests (each hit
lowers it by 0.05 %), and a load test's steps, each started from an idle engine, would each inherit the one
before: in a chat.yaml capacity run, 45 req/s passed with k at 1.2, then failed twice right after an overload
had left k at 2.0.

With `admission="slo"`, a request that would queue (wait > 0) and whose estimate (times k) exceeds
`admission_target_frac` (0.8) of its tier's promise (`tier_ttft_slo_ms`: premium 300 ms, standard 800 ms by
default; the rest of the promise is for what the engine does not see: HTTP, the network, the client) is
refused at once, HTTP 429 with Retry-After = ceil(estimate - target) s (1 to 60), instead of queueing for
seconds; a tier without a promise (basic) keeps only its queue bound, `max_waiting_per_tier`.
While a request waits, a queued request that has shown its client nothing yet (not started, or preempted
before its first text) and whose wait so far plus its own steps passes the engine's share of the promise (the
same target) is shed (`shed_deadline_s`), answered 429 then instead of a first token that would come too late
(the measured rates can change after it was admitted: a burst of a higher tier, or the onset of an overload
before the arrival estimate has seen it). `admission="queue-length"` keeps only the bounds. Either way the
wait is exported as `slobench:estimated_queue_wait_seconds{tier}`.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from engine.request.admission_constants import (
    ARRIVAL_ALPHA,
    IDLE_FORGET_S,
    PREFILL_ALPHA,
    PREFILL_WINDOW_S,
    RESIDENCE_ALPHA,
    RETRY_AFTER_MAX_S,
    STEP_ALPHA,
    TAIL_FACTOR_BOUNDS,
    TAIL_QUANTILE,
    TAIL_STEP,
)
from engine.request.config import EngineConfig
from engine.request.errors import SLOUnattainableError
from engine.request.tiers import TIERS


@dataclass
class QueueSnapshot:
    """Work queued per tier (slots, prefill tokens) and batch slots held per tier, at one moment."""

    queued_slots: dict[str, int]
    queued_tokens: dict[str, int]
    running_slots: dict[str, int]
    kv_blocked_tier: str | None = None  # the tier of the request that last could not join the batch for lack of KV


def ewma(old: float | None, sample: float, alpha: float) -> float:
    return sample if old is None else alpha * sample + (1 - alpha) * old


class AdmissionEstimator:
    """Service rates measured on the engine thread; estimates and admission checks from any thread."""

    def __init__(self, config: EngineConfig, slot_limits: dict[str, int], clock=time.monotonic):
        self.mode = config.admission
        self.slo_s = {t: ms / 1e3 for t, ms in config.tier_ttft_slo_ms.items() if ms and ms > 0}
        self.target_frac = config.admission_target_frac
        self.slot_limits = slot_limits
        chunk = min(config.prefill_chunk_size, config.max_num_batched_tokens)
        self.prefill_chunk = chunk if config.enable_chunked_prefill else None  # None: a prefill runs whole
        self.step_s: float | None = None
        self.mean_residence_s: float | None = None
        self.prefill_tokens_per_s: float | None = None
        self._window_tokens = 0
        self._window_s = 0.0
        self._clock = clock
        # admitted arrivals per tier: the higher tiers' demand is served first, whatever is queued now
        self._last_admit: dict[str, float] = {}
        self.admit_gap_s: dict[str, float] = {}  # EWMA of the gap between admitted requests
        self.mean_prompt: dict[str, float] = {}
        self.tail_factor: dict[str, float] = dict.fromkeys(self.slo_s, 1.0)
        self._last_busy: float | None = None  # when a step last ran the model

    # ---- measurements ---------------------------------------------------------------------------
    def on_admitted(self, tier: str, prompt_tokens: int) -> None:
        """A request of ``tier`` was accepted (the HTTP thread, under the engine's inbox lock)."""
        now = self._clock()
        last = self._last_admit.get(tier)
        if last is not None:
            self.admit_gap_s[tier] = ewma(self.admit_gap_s.get(tier), max(now - last, 1e-6), ARRIVAL_ALPHA)
        self._last_admit[tier] = now
        self.mean_prompt[tier] = ewma(self.mean_prompt.get(tier), float(prompt_tokens), ARRIVAL_ALPHA)

    def arrival_rate(self, tier: str) -> float:
        """Admitted requests per second of ``tier`` lately (0 when it has been quiet for a while)."""
        gap, last = self.admit_gap_s.get(tier), self._last_admit.get(tier)
        if gap is None or last is None:
            return 0.0
        idle = self._clock() - last
        return 1.0 / max(gap, idle)  # a tier that stopped sending stops counting

    def on_outcome(self, tier: str, ttft_s: float | None) -> None:
        """An accepted request of `tier` showed its first text `ttft_s` after its arrival (None: it was shed).

        The tail factor learns from it.
        """
        slo = self.slo_s.get(tier)
        if self.mode != "slo" or slo is None:
            return
        miss = ttft_s is None or ttft_s > self.target_frac * slo
        k = self.tail_factor[tier] * math.exp(TAIL_STEP * (float(miss) - (1.0 - TAIL_QUANTILE)))
        self.tail_factor[tier] = min(max(k, TAIL_FACTOR_BOUNDS[0]), TAIL_FACTOR_BOUNDS[1])

    def on_finished(self, residence_s: float) -> None:
        self.mean_residence_s = ewma(self.mean_residence_s, max(residence_s, 1e-6), RESIDENCE_ALPHA)

    def on_step(self, step_s: float, prefill_tokens: int) -> None:
        """A step that ran the model: its wall time and the prompt tokens it computed."""
        self._last_busy = self._clock()
        self.step_s = ewma(self.step_s, step_s, STEP_ALPHA)
        if prefill_tokens <= 0:
            return
        self._window_tokens += prefill_tokens
        self._window_s += step_s
        if self._window_s >= PREFILL_WINDOW_S:
            rate = self._window_tokens / self._window_s
            self.prefill_tokens_per_s = ewma(self.prefill_tokens_per_s, rate, PREFILL_ALPHA)
            self._window_tokens, self._window_s = 0, 0.0

    # ---- estimates (any thread) -----------------------------------------------------------------
    def queue_wait_s(self, tier: str, snap: QueueSnapshot) -> float:
        """How long a request of `tier` arriving now would queue before its prefill starts."""
        ahead = TIERS[: TIERS.index(tier) + 1]
        slots = sum(snap.queued_slots[t] for t in ahead)
        tokens = sum(snap.queued_tokens[t] for t in ahead)
        running = sum(snap.running_slots.values())
        limit = self.slot_limits[tier]
        if snap.kv_blocked_tier in ahead:
            free, occupancy = 0, max(running, 1)
        else:
            free = max(0, limit - sum(snap.running_slots[t] for t in ahead))
            occupancy = max(1, min(limit, running + slots))
        # the tiers above keep arriving and are served first: only what they leave serves this queue
        above = TIERS[: TIERS.index(tier)]
        wait = 0.0
        if self.mean_residence_s and slots > free:
            turnover = occupancy / self.mean_residence_s - sum(self.arrival_rate(t) for t in above)
            wait = (slots - free) / turnover if turnover > 0 else math.inf
        if self.prefill_tokens_per_s and tokens:
            above_tokens_per_s = sum(self.arrival_rate(t) * self.mean_prompt.get(t, 0.0) for t in above)
            rate = self.prefill_tokens_per_s - above_tokens_per_s
            wait = max(wait, tokens / rate if rate > 0 else math.inf)
        return wait

    def retry_after_s(self, tier: str, snap: QueueSnapshot) -> int:
        """Whole seconds until a request of `tier` could expect room (Retry-After of a 429).

        Its queue's estimated wait, at least 1 and at most RETRY_AFTER_MAX_S (also when the estimate is infinite).
        """
        wait = self.queue_wait_s(tier, snap)
        if not math.isfinite(wait):
            return RETRY_AFTER_MAX_S
        return min(RETRY_AFTER_MAX_S, max(1, math.ceil(wait)))

    def ttft_s(self, tier: str, prompt_tokens: int, snap: QueueSnapshot) -> tuple[float, float]:
        """(queue wait, TTFT estimate) for a request of `tier` with `prompt_tokens` arriving now."""
        wait = self.queue_wait_s(tier, snap)
        steps = 1 + (-(-prompt_tokens // self.prefill_chunk) if self.prefill_chunk else 1)
        return wait, wait + (self.step_s or 0.0) * steps

    def shed_deadline_s(self, tier: str, prompt_tokens: int) -> float | None:
        """How long a queued request of `tier` may wait unstarted before it is shed (None: never).

        Once the wait so far plus its own steps (the one under way, then its prefill chunks) passes the
        engine's share of the promise (`admission_target_frac` of it, as at admission: the rest is for HTTP,
        the network and the client), the request can no longer be counted on to keep it, and answering 429
        now beats a first token that arrives too late. (Against the promise itself, requests started just
        before it ran past it: at the onset of an overload the step-time estimate still reflects the quiet.)
        """
        slo = self.slo_s.get(tier)
        if self.mode != "slo" or slo is None:
            return None
        return self.target_frac * slo - self.own_steps_s(prompt_tokens)

    def own_steps_s(self, prompt_tokens: int) -> float:
        """A request's own time once it starts: the step under way, then its prefill chunks."""
        steps = 1 + (-(-prompt_tokens // self.prefill_chunk) if self.prefill_chunk else 1)
        return (self.step_s or 0.0) * steps

    def _forget_if_idle(self, snap: QueueSnapshot) -> None:
        """A new busy period: the engine has had nothing to do for IDLE_FORGET_S.

        The tail learned in the last one starts over (the module's docstring says why).
        """
        busy = any(snap.queued_slots.values()) or any(snap.running_slots.values())
        if not busy and self._last_busy is not None and self._clock() - self._last_busy >= IDLE_FORGET_S:
            self.tail_factor = dict.fromkeys(self.tail_factor, 1.0)

    def check(self, tier: str, prompt_tokens: int, snap: QueueSnapshot) -> None:
        """Raise SLOUnattainableError when the request would queue past its tier's TTFT promise."""
        slo = self.slo_s.get(tier)
        if self.mode != "slo" or slo is None:
            return
        self._forget_if_idle(snap)
        wait, ttft = self.ttft_s(tier, prompt_tokens, snap)
        ttft *= self.tail_factor[tier]
        target = self.target_frac * slo
        if wait > 0 and ttft > target:
            if math.isfinite(ttft):
                retry = min(RETRY_AFTER_MAX_S, max(1, math.ceil(ttft - target)))
            else:
                retry = RETRY_AFTER_MAX_S
            raise SLOUnattainableError(tier, ttft, slo, retry)
