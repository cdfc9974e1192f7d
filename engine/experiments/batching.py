"""Scheduling claims: continuous vs static batching throughput, and re-batching every 1, 4, 8 steps."""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass

from engine.core.engine import Engine
from engine.experiments.drive import Arrival, config, mean, mixed_workload, poisson_times, quantile, replay, run_batch
from engine.experiments.result import ExperimentResult, Finding, Plot, pct, times


@dataclass(frozen=True)
class BatchingParams:
    model: str = "tiny"
    requests: int = 128  # queued at t = 0: prompts 16-128 tokens, outputs lognormal around 64 (8..384)
    max_num_seqs: int = 32
    kv_cache_tokens: int = 65536  # large enough that batch slots, not KV, are the limit
    seed: int = 0


# "2-3x" is a range: below 2x continuous batching gains less than claimed, above 3x more (the claimed figure
# then understates it).
CLAIMED_RATIO = (2.0, 3.0)


def batching_finding(p: BatchingParams, cont: dict, static: dict) -> Finding:
    """Continuous / static output tokens/s, judged within CLAIMED_RATIO."""
    ratio = cont["output_tok_s"] / static["output_tok_s"]
    occupancy = cont["mean_running"] / static["mean_running"]
    step_cost = cont["mean_step_ms"] / static["mean_step_ms"]
    lo, hi = CLAIMED_RATIO
    fuller = (f"Continuous batching keeps {times(occupancy)} the sequences in the batch (mean "
              f"{cont['mean_running']:.1f} vs {static['mean_running']:.1f} of {p.max_num_seqs} slots) and its steps "
              f"take {times(step_cost)} as long ({cont['mean_step_ms']:.2f} vs {static['mean_step_ms']:.2f} ms)")
    note = ""
    if ratio < lo:
        note = f"{times(ratio)} is {lo / ratio:.2f}x short of {lo:g}x. {fuller}"
        note += (": on this CPU a step's time grows with the batch, so a fuller batch buys less than on a GPU, where a "
                 "memory-bound decode step of a large model costs nearly the same at 8 and 32 sequences."
                 if step_cost > 1.25 else
                 "; the static batch is fuller than the claim assumes (it drains only as fast as its longest answer, "
                 "and these answers vary less than a real chat mix).")
    elif ratio > hi:
        note = (f"it gains more than claimed: {times(ratio)} is {ratio / hi:.2f}x the top of {lo:g}-{hi:g}x. {fuller}; "
                "a static batch idles its slots until its longest answer ends.")
    return Finding(
        claim="continuous batching serves 2-3x the throughput of static batching",
        seed_figure="2-3x", setting=f"{p.requests} mixed requests queued at t=0, {p.max_num_seqs} slots; static "
                                    "fills every slot and refills when the batch drains",
        measured=f"{cont['output_tok_s']:.0f} vs {static['output_tok_s']:.0f} output tok/s: {times(ratio)}",
        value=ratio, holds=lo <= ratio <= hi, rule=f"{lo:g} <= continuous / static output tokens/s <= {hi:g}",
        note=note)


def continuous_batching(p: BatchingParams) -> ExperimentResult:
    work = mixed_workload(p.requests, p.seed)
    cfg = {"model": p.model, "max_num_seqs": p.max_num_seqs, "kv_cache_tokens": p.kv_cache_tokens, "seed": p.seed}
    cont = run_batch(Engine(config(**cfg)), work)
    static = run_batch(Engine(config(**cfg, batching="static")), work)
    finding = batching_finding(p, cont, static)
    ratio = finding.value
    occupancy = cont["mean_running"] / static["mean_running"]
    step_cost = cont["mean_step_ms"] / static["mean_step_ms"]
    plot = Plot("output tokens/s and mean running sequences", "batching", "value")
    plot.add("output tok/s", ["continuous", "static"], [cont["output_tok_s"], static["output_tok_s"]])
    plot.add("mean running x 100", ["continuous", "static"], [cont["mean_running"] * 100, static["mean_running"] * 100])
    return ExperimentResult("continuous-batching", "Continuous vs static batching", asdict(p), [finding],
                            {"continuous": cont, "static": static, "throughput_ratio": ratio,
                             "occupancy_ratio": occupancy, "step_time_ratio": step_cost}, plot)


@dataclass(frozen=True)
class RebatchParams:
    model: str = "tiny"
    intervals: tuple[int, ...] = (1, 4, 8)
    rate_rps: float = 16.0  # Poisson arrivals of the mixed chat workload
    duration_s: float = 15.0
    max_num_seqs: int = 32
    seed: int = 0


def rebatch_interval(p: RebatchParams) -> ExperimentResult:
    rng = random.Random(p.seed)
    ts = poisson_times(p.rate_rps, p.duration_s, rng)
    arrivals = [Arrival(t, prompt, out) for t, (prompt, out) in zip(ts, mixed_workload(len(ts), p.seed), strict=True)]
    by: dict[int, dict] = {}
    for k in p.intervals:
        r = replay(Engine(config(model=p.model, max_num_seqs=p.max_num_seqs, rebatch_interval=k,
                                       seed=p.seed)), arrivals)
        ttft = [o.ttft_ms for o in r.outcomes]
        by[k] = {"schedule_share": r.schedule_share, "process_share": r.process_share,
                 "mean_ttft_ms": mean(ttft), "p90_ttft_ms": quantile(ttft, 0.9),
                 "mean_queue_steps": mean([o.queue_steps for o in r.outcomes]), "requests": len(r.outcomes)}
    high = [k for k in p.intervals if k >= 4]
    worst = max(high, key=lambda k: by[k]["schedule_share"])
    share = by[worst]["schedule_share"]
    note = ""
    if share >= 0.02:
        model_share = 1 - share - by[worst]["process_share"]
        note = (f"{pct(share)} at interval {worst} is {share / 0.02:.2f}x the 2% bound; the model's share of a step "
                f"is {pct(model_share)}: the tiny model's steps are so short that the scheduler's fixed work per step "
                "weighs more than next to a large model's.")
    lo, hi = min(p.intervals), max(p.intervals)
    cost = by[hi]["mean_ttft_ms"] / by[lo]["mean_ttft_ms"] - 1
    ttft_note = ""
    if cost > 0.10:
        ttft_note = (f"mean TTFT {by[hi]['mean_ttft_ms']:.1f} ms at {hi} vs {by[lo]['mean_ttft_ms']:.1f} ms at {lo} "
                     f"(+{pct(cost)}): a new request waits up to {hi} steps to join the batch (mean "
                     f"{by[hi]['mean_queue_steps']:.1f} steps vs {by[lo]['mean_queue_steps']:.1f}) and a step here "
                     "is long next to the TTFT.")
    findings = [
        Finding(claim="scheduling overhead stays under 2% of step time when re-batching every 4-8 steps",
                seed_figure="< 2% at 4-8",
                setting=f"Poisson {p.rate_rps:g} req/s of the chat mix for {p.duration_s:g} s",
                measured=", ".join(f"{pct(by[k]['schedule_share'])} at {k}" for k in p.intervals),
                value=share, holds=share < 0.02, rule="scheduler share of step time < 2% at every interval >= 4",
                note=note),
        Finding(claim="re-batching less often costs little TTFT", seed_figure="a small TTFT cost",
                setting=f"interval {hi} vs {lo}, same arrivals",
                measured=", ".join(f"mean TTFT {by[k]['mean_ttft_ms']:.1f} ms at {k}" for k in p.intervals),
                value=cost, holds=cost <= 0.10, rule=f"mean TTFT at {hi} at most 10% above at {lo}", note=ttft_note),
    ]
    plot = Plot("scheduler share of step time and mean TTFT", "re-batching interval (steps)", "value", kind="line")
    plot.add("scheduler share (%)", list(p.intervals), [by[k]["schedule_share"] * 100 for k in p.intervals])
    plot.add("mean TTFT (ms)", list(p.intervals), [by[k]["mean_ttft_ms"] for k in p.intervals])
    return ExperimentResult("rebatch-interval", "Re-batching every 1, 4, 8 steps", asdict(p), findings,
                            {"by_interval": {str(k): v for k, v in by.items()}}, plot)
