"""Driving an `Engine` in-process for the experiments (and bench/engine_bench.py): a queue of requests at
t = 0 run to completion, or requests added as the engine's clock passes their arrival times. In-process
runs skip HTTP, so they are faster and steadier than a load test; the server is not what these measure."""

from __future__ import annotations

import random
import statistics
import time
from dataclasses import dataclass, field

from engine.core.engine import Engine
from engine.request.config import EngineConfig
from engine.request.errors import QueueFullError, SLOUnattainableError
from engine.request.sampling import SamplingParams
from engine.request.tiers import TIERS


def config(**knobs) -> EngineConfig:
    """An `EngineConfig` for measuring scheduling: admission only bounds queues, and the bound is never met,
    so no request is refused or shed (SLO-aware admission would shed a queue at t = 0 that outlasts the
    promise); the overload experiment sets its own admission."""
    knobs.setdefault("admission", "queue-length")
    knobs.setdefault("max_waiting_per_tier", dict.fromkeys(TIERS, 1_000_000))
    return EngineConfig(**knobs)


def mixed_workload(n: int, seed: int = 0) -> list[tuple[list[int], int]]:
    """Chat-like mix: prompts 16-128 tokens, outputs lognormal around 64 (8..384): lengths vary a lot."""
    rng = random.Random(seed)
    work = []
    for _ in range(n):
        prompt = [rng.randrange(256) for _ in range(rng.randint(16, 128))]
        out = int(min(384, max(8, rng.lognormvariate(4.2, 0.8))))
        work.append((prompt, out))
    return work


def run_batch(engine: Engine, work: list[tuple[list[int], int]], max_tokens_cap: int | None = None) -> dict:
    """Queue every request at t=0 and run to completion; figures averaged over every step.

    With max_tokens_cap, each request asks for that many tokens (as API clients commonly do) but ends at
    its own length, the way a real model stops at end-of-sequence; the random-weight model has no such
    sense, so the run ends it (abort) once it has produced its length.
    """
    targets = {}
    for prompt, out in work:
        params = SamplingParams(max_tokens=max_tokens_cap or out, temperature=0.0, ignore_eos=True)
        targets[engine.add_request(prompt, params)] = out
    frag, running, saturated, usage, per_seq = [], [], [], [], []
    start = time.perf_counter()
    tokens = shed = 0
    while engine.has_unfinished_requests():
        for o in engine.step():
            if o.finished:
                tokens += len(o.token_ids)
                shed += o.outputs[0].finish_reason == "shed"
            elif max_tokens_cap and len(o.token_ids) >= targets[o.request_id]:
                engine.abort(o.request_id)
        s = engine.stats()
        if s.used_kv_blocks:
            frag.append(s.fragmentation)
            usage.append(s.kv_usage)
        if s.num_running_seqs:
            per_seq.append(s.used_kv_blocks / s.num_running_seqs)
        running.append(s.num_running)
        if s.num_waiting:
            saturated.append(s.num_running)
    wall = time.perf_counter() - start
    engine.check_integrity()
    s = engine.stats()
    return {
        "wall_s": wall,
        "output_tokens": tokens,
        "shed": shed,  # 0 unless the engine's admission sheds (see `config`)
        "output_tok_s": tokens / wall,
        "mean_fragmentation": statistics.fmean(frag),
        "mean_running": statistics.fmean(running),
        # while requests were still queued, i.e. when the KV pool or batch slots were the limit
        "mean_running_saturated": statistics.fmean(saturated) if saturated else float("nan"),
        "mean_kv_usage": statistics.fmean(usage),
        "mean_blocks_per_seq": statistics.fmean(per_seq) if per_seq else 0.0,
        "steps": s.steps,
        "mean_step_ms": wall / s.steps * 1e3,
        "schedule_share": s.schedule_time_s / s.step_time_s,
        "process_share": s.process_time_s / s.step_time_s,
    }


def decode_rate(engine: Engine, batch: int, steps: int = 20) -> dict:
    """Median step time of `batch` sequences decoding together (the engine needs max_num_seqs >= batch)."""
    params = SamplingParams(max_tokens=steps + 8, temperature=0.0, ignore_eos=True)
    for i in range(batch):
        engine.add_request([(i + j) % 256 for j in range(32)], params)
    while engine.stats().num_running < batch or engine.scheduler.num_waiting():
        engine.step()
    engine.step()  # every prefill done: from here each step is one decode token per sequence
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - t)
    while engine.has_unfinished_requests():
        engine.step()
    step = statistics.median(times)
    return {"batch": batch, "median_step_ms": step * 1e3, "decode_tok_s": batch / step}


@dataclass
class Arrival:
    t: float  # seconds after the start
    prompt: list[int]
    max_tokens: int
    tier: str = "standard"
    label: str = ""  # the traffic class it belongs to ("interactive", "batch" ...)


@dataclass
class Outcome:
    """One request of a replay: refused at arrival, or what the engine's timing says (from its arrival)."""

    label: str
    tier: str
    arrival_s: float
    refused: str | None = None  # "queue_full" | "slo_unattainable" | "shed": an HTTP server's 429
    finish_reason: str | None = None
    queue_ms: float | None = None
    ttft_ms: float | None = None
    finished_s: float | None = None
    output_tokens: int = 0
    queue_steps: int | None = None  # engine steps from its arrival to its first scheduled step
    max_gap_ms: float | None = None  # its largest inter-token gap
    token_times_s: list[float] = field(default_factory=list)


@dataclass
class StepSample:
    t: float
    step_ms: float
    running: int
    waiting: int
    swapped: int
    batch_fill: float
    kv_usage: float


@dataclass
class Replay:
    outcomes: list[Outcome]
    steps: list[StepSample]
    wall_s: float
    num_preemptions: int
    num_swap_outs: int
    schedule_share: float
    process_share: float

    def of(self, label: str) -> list[Outcome]:
        return [o for o in self.outcomes if o.label == label]

    def time_weighted_fill(self) -> float:
        """Batch fill averaged over the run's time, idle time counted as empty."""
        busy = sum(s.batch_fill * s.step_ms for s in self.steps) / 1e3
        return busy / self.wall_s if self.wall_s else 0.0


def replay(engine: Engine, arrivals: list[Arrival], until_s: float | None = None) -> Replay:
    """Add each request once the clock passes its arrival; step while there is work, else sleep to the next
    arrival. A request is timed from its own arrival time, not from when it was added (a step may run
    past it), as a client would time it. Ends when every request has finished (or at `until_s`)."""
    pending = sorted(range(len(arrivals)), key=lambda i: arrivals[i].t)
    outcomes = [Outcome(a.label, a.tier, a.t) for a in arrivals]
    by_id: dict[str, int] = {}
    unstarted: dict[str, int] = {}  # request id -> the engine's step count when it was added
    steps: list[StepSample] = []
    t0 = time.monotonic()
    nxt = 0
    while nxt < len(pending) or engine.has_unfinished_requests():
        now = time.monotonic() - t0
        if until_s is not None and now > until_s:
            break
        while nxt < len(pending) and arrivals[pending[nxt]].t <= now:
            i = pending[nxt]
            nxt += 1
            a = arrivals[i]
            try:
                rid = engine.add_request(a.prompt, SamplingParams(max_tokens=a.max_tokens, temperature=0.0,
                                                                  ignore_eos=True), tier=a.tier)
            except QueueFullError:
                outcomes[i].refused = "queue_full"
                continue
            except SLOUnattainableError:
                outcomes[i].refused = "slo_unattainable"
                continue
            by_id[rid] = i
            unstarted[rid] = engine.scheduler.step_count
        if not engine.has_unfinished_requests():
            if nxt < len(pending):
                time.sleep(max(0.0, arrivals[pending[nxt]].t - (time.monotonic() - t0)))
            continue
        start = time.monotonic()
        outs = engine.step()
        for rid in [r for r in unstarted if r in engine.requests and engine.requests[r].first_scheduled_time]:
            # steps waited, a count the machine's speed does not change (this step included: it started here)
            outcomes[by_id[rid]].queue_steps = engine.scheduler.step_count - unstarted.pop(rid)
        for out in outs:
            if out.finished:
                if out.request_id in unstarted and out.timing.first_scheduled_time is not None:
                    outcomes[by_id[out.request_id]].queue_steps = (engine.scheduler.step_count
                                                                   - unstarted[out.request_id])
                unstarted.pop(out.request_id, None)
                _record(outcomes[by_id[out.request_id]], out, t0)
        s = engine.stats()
        steps.append(StepSample(start - t0, (time.monotonic() - start) * 1e3, s.num_running, s.num_waiting,
                                s.num_swapped, s.batch_fill_ratio, s.kv_usage))
    wall = time.monotonic() - t0
    engine.check_integrity()
    s = engine.stats()
    return Replay(outcomes, steps, wall, s.num_preemptions, s.num_swap_outs,
                  s.schedule_time_s / s.step_time_s if s.step_time_s else 0.0,
                  s.process_time_s / s.step_time_s if s.step_time_s else 0.0)


def _record(o: Outcome, out, t0: float) -> None:
    timing = out.timing
    o.finish_reason = out.outputs[0].finish_reason
    if o.finish_reason == "shed":
        o.refused = "shed"
        return
    arrival = t0 + o.arrival_s
    o.output_tokens = len(out.token_ids)
    o.finished_s = timing.finished_time - t0
    if timing.first_scheduled_time is not None:
        o.queue_ms = (timing.first_scheduled_time - arrival) * 1e3
    if timing.first_token_time is not None:
        o.ttft_ms = (timing.first_token_time - arrival) * 1e3
    o.token_times_s = [t - t0 for t in timing.token_times]
    gaps = [b - a for a, b in zip(timing.token_times, timing.token_times[1:], strict=False)]
    o.max_gap_ms = max(gaps) * 1e3 if gaps else None


def quantile(values: list[float], q: float) -> float | None:
    """The q-quantile (linear between order statistics); None for no values."""
    xs = sorted(v for v in values if v is not None)
    if not xs:
        return None
    pos = q * (len(xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def mean(values: list[float]) -> float | None:
    xs = [v for v in values if v is not None]
    return statistics.fmean(xs) if xs else None


def poisson_times(rate: float, duration_s: float, rng: random.Random, start: float = 0.0) -> list[float]:
    """Arrival times of a Poisson process of `rate` per second over [start, start + duration_s)."""
    out, t = [], start
    while True:
        t += rng.expovariate(rate)
        if t >= start + duration_s:
            return out
        out.append(t)


def prompt(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(256) for _ in range(n)]
