"""A discrete-event simulation of the reference engine's continuous batching, priced by a step-time model.

What it models (``engine/scheduler/scheduler.py`` is the reference): each step packs a token budget
(``max_num_batched_tokens``): running requests in rank order (tier, then arrival) take one token each when
decoding and a chunk (at most ``prefill_chunk_size``) when prefilling; new requests join every
``rebatch_interval`` steps, or at once after a finish or when nothing runs, in rank order while batch slots
(``max_num_seqs``), budget and KV blocks last; a request that cannot join stops every one ranked below it from
joining (strict tiers). A request's first token comes at the end of the step that computes its last prompt
token, then one token a step. Paged KV: a request reserves, when it joins, the blocks of its whole life
(prompt + answer - 1 tokens, rounded up to blocks), so nothing is ever preempted (the engine allocates as it
goes and preempts under pressure: this is the conservative end); a shared system prompt's full blocks are held
once while any running request uses them and, with prefix caching, are not prefilled again once computed.
Admission at arrival: a full tier queue (``max_waiting_per_tier``) or, in ``slo`` mode, an estimated TTFT over
``admission_target_frac`` of the tier's promise refuses the request (an infinite latency for the SLO rule),
with the estimate ``engine/core/admission.py`` makes (and its constants,
``engine/request/admission_constants.py``) from the simulated engine's own measured turnover, prefill rate and
step time, times its tail factor (learned from the simulated requests' own TTFTs); a queued request that has
not started by its shed deadline (the engine's share of the promise less its own steps) is shed, refused too;
the tail factor starts over after the engine sat idle.

Steps are priced by a :class:`~loadgen.planning.step_model.StepModel`; a run of pure decode steps with nothing
waiting to join is priced in one vectorised go up to the next finish or arrival, so the simulation is exact
step by step and still fast. With a constant step time, one-token prompts and ``max_num_seqs = c`` it is an
M/D/c queue (``tests/loadgen/planning/test_plan_simulate.py``).
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from engine.request.admission_constants import (
    ARRIVAL_ALPHA,
    IDLE_FORGET_S,
    PREFILL_ALPHA,
    PREFILL_WINDOW_S,
    RESIDENCE_ALPHA,
    STEP_ALPHA,
    TAIL_FACTOR_BOUNDS,
    TAIL_QUANTILE,
    TAIL_STEP,
)
from engine.request.tiers import DEFAULT_TIER, TIER_RANK, TIERS
from loadgen.planning.requests import Requests
from loadgen.planning.step_model import StepModel


@dataclass(frozen=True)
class EngineShape:
    """The scheduler's knobs (``EngineConfig``'s names); ``kv_tokens`` is the KV pool in tokens."""

    max_num_seqs: int = 64
    max_num_batched_tokens: int = 512
    prefill_chunk_size: int = 256
    enable_chunked_prefill: bool = True
    block_size: int = 16
    kv_tokens: int = 65536
    enable_prefix_caching: bool = True
    rebatch_interval: int = 1
    admission: str = "slo"  # slo | queue-length | none
    tier_ttft_slo_ms: dict[str, float] = field(default_factory=dict)
    admission_target_frac: float = 0.8
    max_waiting_per_tier: dict[str, int] = field(default_factory=dict)

    @property
    def chunk(self) -> int | None:
        return min(self.prefill_chunk_size, self.max_num_batched_tokens) if self.enable_chunked_prefill else None


@dataclass
class SimResult:
    arrive: np.ndarray
    tier: np.ndarray
    first_s: np.ndarray  # first token time (nan: refused)
    done_s: np.ndarray
    start_s: np.ndarray  # joined the batch
    n_out: np.ndarray
    rejected: np.ndarray
    steps: int

    def values_ms(self, metric: str) -> np.ndarray:
        """Each request's SLO value (ms), refused ones as inf (the SLO rule); TPOT nan for one-token answers."""
        ttft = (self.first_s - self.arrive) * 1e3
        if metric in ("ttft_ms", "ttfot_ms"):
            v = ttft
        elif metric == "e2el_ms":
            v = (self.done_s - self.arrive) * 1e3
        elif metric == "tpot_ms":
            with np.errstate(invalid="ignore", divide="ignore"):
                v = np.where(self.n_out > 1, (self.done_s - self.first_s) * 1e3 / (self.n_out - 1), np.nan)
        else:
            raise ValueError(f"the simulation does not know the SLO metric {metric}")
        return np.where(self.rejected, np.inf, v)

    @property
    def wait_s(self) -> np.ndarray:
        return self.start_s - self.arrive


class _Admission:
    """The engine's SLO-aware admission estimate over the simulated engine's measured rates."""

    def __init__(self, eng: EngineShape):
        self.eng = eng
        self.residence = self.prefill_rate = self.step = None
        self.window = [0, 0.0]
        self.gap: dict[str, float] = {}
        self.last: dict[str, float] = {}
        self.prompt: dict[str, float] = {}
        self.tail: dict[str, float] = {}  # the tail factor per tier (1 until an outcome moves it)

    @staticmethod
    def ewma(old, x, a):
        return x if old is None else a * x + (1 - a) * old

    def on_step(self, dt: float, pf_tokens: int, steps: int = 1) -> None:
        keep = (1 - STEP_ALPHA) ** steps
        self.step = dt if self.step is None else keep * self.step + (1 - keep) * dt
        if pf_tokens:
            self.window[0] += pf_tokens
            self.window[1] += dt
            if self.window[1] >= PREFILL_WINDOW_S:
                self.prefill_rate = self.ewma(self.prefill_rate, self.window[0] / self.window[1], PREFILL_ALPHA)
                self.window = [0, 0.0]

    def on_admitted(self, tier: str, prompt: int, t: float) -> None:
        if tier in self.last:
            self.gap[tier] = self.ewma(self.gap.get(tier), max(t - self.last[tier], 1e-6), ARRIVAL_ALPHA)
        self.last[tier] = t
        self.prompt[tier] = self.ewma(self.prompt.get(tier), float(prompt), ARRIVAL_ALPHA)

    def outcome(self, tier: str, ttft_s: float | None) -> None:
        """An accepted request's TTFT (None: shed) moves its tier's tail factor, as the engine's does."""
        slo = self.eng.tier_ttft_slo_ms.get(tier)
        if self.eng.admission != "slo" or not slo:
            return
        miss = ttft_s is None or ttft_s > self.eng.admission_target_frac * slo / 1e3
        k = self.tail.get(tier, 1.0) * math.exp(TAIL_STEP * (float(miss) - (1.0 - TAIL_QUANTILE)))
        self.tail[tier] = min(max(k, TAIL_FACTOR_BOUNDS[0]), TAIL_FACTOR_BOUNDS[1])

    def idle(self, gap_s: float) -> None:
        """The engine sat idle (nothing running or queued) for ``gap_s``: from IDLE_FORGET_S on, the tail
        factor starts over, as the engine's does."""
        if gap_s >= IDLE_FORGET_S:
            self.tail.clear()

    def own_steps(self, prompt: int) -> int:
        """The step under way, then the request's prefill chunks."""
        chunk = self.eng.chunk
        return 1 + (-(-prompt // chunk) if chunk else 1)

    def shed_deadline_s(self, tier: str, prompt: int) -> float | None:
        """How long a queued request may wait unstarted before it is shed (None: never)."""
        slo = self.eng.tier_ttft_slo_ms.get(tier)
        if self.eng.admission != "slo" or not slo:
            return None
        return self.eng.admission_target_frac * slo / 1e3 - (self.step or 0.0) * self.own_steps(prompt)

    def rate(self, tier: str, t: float) -> float:
        if tier not in self.gap:
            return 0.0
        return 1.0 / max(self.gap[tier], t - self.last[tier])

    def ttft_s(self, rank: int, prompt: int, t: float, queued: list[int], tokens: list[int], running: list[int],
               kv_blocked: int | None) -> tuple[float, float]:
        slots, toks = sum(queued[: rank + 1]), sum(tokens[: rank + 1])
        limit, run = self.eng.max_num_seqs, sum(running)
        if kv_blocked is not None and kv_blocked <= rank:
            free, occ = 0, max(run, 1)
        else:
            free, occ = max(0, limit - sum(running[: rank + 1])), max(1, min(limit, run + slots))
        above = TIERS[:rank]
        wait = 0.0
        if self.residence and slots > free:
            turnover = occ / self.residence - sum(self.rate(a, t) for a in above)
            wait = (slots - free) / turnover if turnover > 0 else math.inf
        if self.prefill_rate and toks:
            left = self.prefill_rate - sum(self.rate(a, t) * self.prompt.get(a, 0.0) for a in above)
            wait = max(wait, toks / left if left > 0 else math.inf)
        return wait, wait + (self.step or 0.0) * self.own_steps(prompt)


def simulate(req: Requests, rate: float, eng: EngineShape, model: StepModel) -> SimResult:
    """Every request's first-token and finish time at ``rate`` req/s (the draw's arrivals scaled)."""
    arrive = req.arrive / rate
    n = len(arrive)
    n_in, n_out = req.n_in.tolist(), req.n_out.tolist()
    tiers = req.tier.tolist()
    rank = [TIER_RANK.get(t, TIER_RANK[DEFAULT_TIER]) for t in tiers]  # anything else (no tier) ranks as standard
    pfx, pfx_len = req.prefix.tolist(), req.prefix_len.tolist()
    bs, budget0, chunk = eng.block_size, eng.max_num_batched_tokens, eng.chunk
    kv_cap = eng.kv_tokens // bs
    first, done, start = np.full(n, np.nan), np.full(n, np.nan), np.full(n, np.nan)
    rejected = np.zeros(n, dtype=bool)
    computed, gen, blocks = [0] * n, [0] * n, [0] * n
    waiting: list[deque] = [deque() for _ in TIERS]  # per rank
    wtokens = [0] * len(TIERS)  # queued prefill tokens per rank
    rslots = [0] * len(TIERS)  # running slots per rank
    running: list[tuple[int, int]] = []  # (rank, index), kept sorted: rank order
    holders: dict[int, int] = {}  # shared prefix -> running requests holding its blocks
    ready: set[int] = set()  # shared prefixes computed once (prefix cache)
    adm = _Admission(eng)
    t, step, nxt, kv_used = 0.0, 0, 0, 0
    rebatch_due, kv_blocked = False, None

    def shared_blocks(i: int) -> int:
        return pfx_len[i] // bs if pfx[i] >= 0 else 0

    def tokens_for(rem: int, budget: int) -> int:
        if budget <= 0:
            return 0
        if rem <= 1 or chunk is not None:
            return rem if rem <= 1 else min(rem, chunk, budget)
        return rem if rem <= budget or budget == budget0 else 0

    def enqueue(i: int) -> None:
        r, tier = rank[i], tiers[i]
        cap = eng.max_waiting_per_tier.get(tier)
        if -(-(n_in[i] + n_out[i] - 1) // bs) > kv_cap or (cap is not None and len(waiting[r]) >= cap):
            # could never fit the pool alone (the engine's 400), or its tier's queue is full (429)
            rejected[i] = True
            return
        slo = eng.tier_ttft_slo_ms.get(tier)
        if eng.admission == "slo" and slo:
            pending = [0] * len(TIERS)
            for rr, j in running:
                pending[rr] += n_in[j] - computed[j]
            toks = [a + b for a, b in zip(wtokens, pending, strict=True)]
            wait, ttft = adm.ttft_s(r, n_in[i], t, [len(q) for q in waiting], toks, rslots, kv_blocked)
            if wait > 0 and ttft * adm.tail.get(tier, 1.0) > eng.admission_target_frac * slo / 1e3:
                rejected[i] = True
                return
        adm.on_admitted(tier, n_in[i], t)
        waiting[r].append(i)
        wtokens[r] += n_in[i]

    def shed_at(i: int) -> float:
        deadline = adm.shed_deadline_s(tiers[i], n_in[i])
        return math.inf if deadline is None else arrive[i] + deadline

    def shed_late() -> float:
        """Shed every queued request past its deadline (each queue in arrival order, up to the first one
        with time left, as the engine does); the next deadline after that."""
        nxt_shed = math.inf
        for r, q in enumerate(waiting):
            while q and shed_at(q[0]) < t:
                i = q.popleft()
                wtokens[r] -= n_in[i]
                rejected[i] = True
                adm.outcome(tiers[i], None)
            if q:
                nxt_shed = min(nxt_shed, shed_at(q[0]))
        return nxt_shed

    def finish(i: int) -> None:
        nonlocal kv_used, rebatch_due, kv_blocked
        done[i] = t
        kv_blocked = None  # blocks are free again: the next join finds out whether they suffice
        running.remove((rank[i], i))
        rslots[rank[i]] -= 1
        kv_used -= blocks[i]
        if pfx[i] >= 0 and shared_blocks(i) and eng.enable_prefix_caching:
            holders[pfx[i]] -= 1
            if holders[pfx[i]] == 0:
                kv_used -= shared_blocks(i)
        adm.residence = adm.ewma(adm.residence, max(t - start[i], 1e-6), RESIDENCE_ALPHA)
        rebatch_due = True

    def try_join(budget: int, sched: list) -> int:
        nonlocal kv_used, kv_blocked
        kv_blocked = None
        for r in range(len(TIERS)):
            q = waiting[r]
            while q:
                if budget <= 0 or len(running) >= eng.max_num_seqs:
                    return budget
                i = q[0]
                share = shared_blocks(i) if eng.enable_prefix_caching else 0
                own = -(-(n_in[i] + n_out[i] - 1) // bs) - share
                extra = share if share and holders.get(pfx[i], 0) == 0 else 0
                if kv_used + own + extra > kv_cap:
                    kv_blocked = r
                    return budget
                q.popleft()
                wtokens[r] -= n_in[i]
                kv_used += own + extra
                blocks[i] = own
                if share:
                    holders[pfx[i]] = holders.get(pfx[i], 0) + 1
                computed[i] = share * bs if share and pfx[i] in ready else 0
                start[i] = t
                bisect.insort(running, (r, i))
                rslots[r] += 1
                k = tokens_for(n_in[i] - computed[i], budget)
                if k:
                    sched.append((i, k))
                    budget -= k
        return budget

    while True:
        while nxt < n and arrive[nxt] <= t:
            enqueue(nxt)
            nxt += 1
        next_shed = shed_late()
        queued = any(waiting)
        if not running and not queued:
            if nxt >= n:
                break
            adm.idle(float(arrive[nxt]) - t)
            t = float(arrive[nxt])
            continue
        m = len(running)
        if (m and m <= budget0 and all(computed[i] == n_in[i] for _, i in running)
                and (not queued or m >= eng.max_num_seqs or kv_blocked is not None)):
            # a run of pure decode steps: nothing changes until a request finishes or one arrives
            k = min(n_out[i] - gen[i] for _, i in running)
            ctx = sum(n_in[i] + gen[i] for _, i in running) + m * np.arange(k)
            cum = t + np.cumsum(model.step_s(m, m, ctx, ctx))
            until = min(arrive[nxt] if nxt < n else math.inf, next_shed)  # an arrival or a shedding changes things
            if until < cum[-1]:
                k = int(np.searchsorted(cum, until)) + 1
            adm.on_step(float(cum[k - 1] - t) / k, 0, k)
            t, step = float(cum[k - 1]), step + k
            for _, i in list(running):
                gen[i] += k
                if gen[i] >= n_out[i]:
                    finish(i)
            continue
        step += 1
        join = rebatch_due or not running or step % eng.rebatch_interval == 0
        if join:
            rebatch_due = False
        budget, sched = budget0, []
        for _, i in running:
            k = tokens_for(n_in[i] - computed[i] if computed[i] < n_in[i] else 1, budget)
            if k:
                sched.append((i, k))
                budget -= k
        if join:
            budget = try_join(budget, sched)
        if not sched:  # cannot happen: the best-ranked running request always gets tokens, and an idle engine
            raise AssertionError("simulation stalled")  # lets the first waiting request join (it fits alone)
        n_tok = kv = pairs = pf = 0
        for i, k in sched:
            c = computed[i] if computed[i] < n_in[i] else n_in[i] + gen[i] - 1
            n_tok += k
            kv += c + k
            pairs += k * (c + (k + 1) / 2)
            pf += k if computed[i] < n_in[i] else 0
        dt = float(model.step_s(len(sched), n_tok, kv, pairs))
        t += dt
        adm.on_step(dt, pf)
        for i, k in sched:
            if computed[i] < n_in[i]:
                computed[i] += k
                if pfx[i] >= 0 and computed[i] >= shared_blocks(i) * bs:
                    ready.add(pfx[i])
                if computed[i] < n_in[i]:
                    continue
                first[i] = t
                adm.outcome(tiers[i], t - arrive[i])
            gen[i] += 1
            if gen[i] >= n_out[i]:
                finish(i)
    return SimResult(arrive, req.tier, first, done, start, req.n_out, rejected, step)
