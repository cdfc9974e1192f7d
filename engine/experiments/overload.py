"""Under load: swapping at 90% KV with SLO-aware admission under overload, and the batch fill ratio falling
when arrivals are sparse or tiering holds back too many slots."""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass

from engine.config import EngineConfig
from engine.engine import Engine
from engine.experiments.drive import Arrival, config, mixed_workload, poisson_times, prompt, quantile, replay, run_batch
from engine.experiments.result import ExperimentResult, Finding, Plot, pct


@dataclass(frozen=True)
class OverloadParams:
    model: str = "tiny"
    kv_cache_tokens: int = 4096  # small: KV, not slots, fills first, so the 90% watermark is reached
    max_num_seqs: int = 32
    kv_watermark: float = 0.9
    tier_mix: tuple[tuple[str, float], ...] = (("premium", 0.2), ("standard", 0.5), ("basic", 0.3))
    prompt_len: tuple[int, int] = (64, 256)
    output_len: tuple[int, int] = (64, 192)
    overload: float = 3.0  # offered load / the capacity measured first on the same engine settings
    duration_s: float = 20.0
    calibration_requests: int = 64
    premium_ttft_slo_ms: float = 300.0
    seed: int = 0


def _config(p: OverloadParams, admission: bool) -> EngineConfig:
    knobs = {"model": p.model, "kv_cache_tokens": p.kv_cache_tokens, "max_num_seqs": p.max_num_seqs,
             "kv_watermark": p.kv_watermark, "seed": p.seed}
    if not admission:  # measuring the capacity: a queue at t = 0 that nothing refuses or sheds
        return config(**knobs)
    return EngineConfig(**knobs, admission="slo", tier_ttft_slo_ms={"premium": p.premium_ttft_slo_ms,
                                                                    "standard": 800.0})


def overload(p: OverloadParams) -> ExperimentResult:
    rng = random.Random(p.seed)
    calib = [(prompt(rng, rng.randint(*p.prompt_len)), rng.randint(*p.output_len))
             for _ in range(p.calibration_requests)]
    cap = run_batch(Engine(_config(p, admission=False)), calib)
    capacity_rps = p.calibration_requests / cap["wall_s"]
    tiers, weights = zip(*p.tier_mix, strict=True)
    arrivals = [Arrival(t, prompt(rng, rng.randint(*p.prompt_len)), rng.randint(*p.output_len), tier, tier)
                for t in poisson_times(p.overload * capacity_rps, p.duration_s, rng)
                for tier in rng.choices(tiers, weights)]
    r = replay(Engine(_config(p, admission=True)), arrivals)
    refused = {k: sum(o.refused == k for o in r.outcomes) for k in ("queue_full", "slo_unattainable", "shed")}
    served = [o for o in r.outcomes if o.refused is None]
    lost = [o for o in served if o.finish_reason not in ("length", "stop")]
    peak_kv = max((s.kv_usage for s in r.steps), default=0.0)
    p99 = {t: quantile([o.ttft_ms for o in served if o.tier == t], 0.99) for t in tiers}
    premium = p99.get("premium")
    premium_share = dict(p.tier_mix).get("premium", 0.0) / sum(weights)
    no_loss = Finding(
        claim="swapping at 90% KV with admission control keeps an overloaded engine from failing requests",
        seed_figure="no failures",
        setting=f"{p.overload:g}x the measured capacity ({capacity_rps:.1f} req/s) for {p.duration_s:g} s, "
                f"{p.kv_cache_tokens}-token KV, watermark {p.kv_watermark:g}",
        measured=f"{len(r.outcomes)} requests: {len(served)} served, {sum(refused.values())} refused (429), "
                 f"{len(lost)} lost; {r.num_swap_outs} swap-outs, peak KV {pct(peak_kv)}",
        value=float(len(lost)), holds=not lost, rule="every request served or refused, none lost",
        note="" if not lost else f"{len(lost)} accepted requests ended with "
        f"{sorted({str(o.finish_reason) for o in lost})} instead of their answer.")
    held = premium is not None and premium <= p.premium_ttft_slo_ms
    slo = Finding(
        claim="the premium tier's TTFT promise holds under overload",
        seed_figure=f"p99 <= {p.premium_ttft_slo_ms:g} ms",
        setting=f"{pct(premium_share)} of the load premium", value=premium, holds=held,
        measured=f"premium p99 TTFT {premium:.0f} ms" if premium is not None else "no premium request served",
        rule=f"premium p99 TTFT <= {p.premium_ttft_slo_ms:g} ms",
        note="" if held or premium is None else
        f"{premium:.0f} ms is {premium / p.premium_ttft_slo_ms:.2f}x the promise: premium alone arrives at "
        f"{p.overload * premium_share:.2f}x the measured capacity, so admission must refuse premium itself, and its "
        f"estimate trails bursts ({refused['shed']} shed after queueing).")
    plot = Plot("requests by outcome under overload", "outcome", "requests")
    outcome_names = ["served", "queue_full", "slo_unattainable", "shed", "lost"]
    plot.add("requests", outcome_names, [len(served), *refused.values(), len(lost)])
    data = {"capacity_rps": capacity_rps, "offered": len(r.outcomes), "served": len(served), "refused": refused,
            "lost": len(lost), "swap_outs": r.num_swap_outs, "preemptions": r.num_preemptions, "peak_kv_usage": peak_kv,
            "p99_ttft_ms": p99, "wall_s": r.wall_s}
    return ExperimentResult("overload", "Swapping and admission control under overload", asdict(p), [no_loss, slo],
                            data, plot)


@dataclass(frozen=True)
class FillParams:
    model: str = "tiny"
    max_num_seqs: int = 32
    rates_rps: tuple[float, ...] = (1.0, 4.0, 16.0, 32.0)  # Poisson arrivals of the chat mix
    duration_s: float = 8.0
    reserved_slots: tuple[int, ...] = (0, 8, 16, 24)  # premium_reserved_slots, with no premium traffic
    backlog_requests: int = 96
    seed: int = 0


def batch_fill(p: FillParams) -> ExperimentResult:
    rng = random.Random(p.seed)
    by_rate = {}
    for rate in p.rates_rps:
        ts = poisson_times(rate, p.duration_s, rng)
        arrivals = [Arrival(t, q, o) for t, (q, o) in zip(ts, mixed_workload(len(ts), p.seed), strict=True)]
        r = replay(Engine(config(model=p.model, max_num_seqs=p.max_num_seqs, seed=p.seed)), arrivals)
        by_rate[rate] = {"fill": r.time_weighted_fill(), "requests": len(arrivals)}
    work = mixed_workload(p.backlog_requests, p.seed)
    by_reserved = {}
    for k in p.reserved_slots:
        b = run_batch(Engine(config(model=p.model, max_num_seqs=p.max_num_seqs, premium_reserved_slots=k,
                                          seed=p.seed)), work)
        by_reserved[k] = {"fill": b["mean_running_saturated"] / p.max_num_seqs, "output_tok_s": b["output_tok_s"]}
    lo, hi = min(p.rates_rps), max(p.rates_rps)
    k0, k1 = min(p.reserved_slots), max(p.reserved_slots)
    sparse, dense = by_rate[lo]["fill"], by_rate[hi]["fill"]
    open_, held = by_reserved[k0]["fill"], by_reserved[k1]["fill"]
    findings = [
        Finding(claim="the batch fill ratio falls when arrivals are sparse", seed_figure="falls",
                setting=f"chat mix at {', '.join(f'{x:g}' for x in p.rates_rps)} req/s, {p.max_num_seqs} slots",
                measured=", ".join(f"{pct(v['fill'])} at {x:g}" for x, v in by_rate.items()), value=sparse,
                holds=sparse < dense, rule=f"fill (time-weighted, idle counted empty) at {lo:g} < at {hi:g} req/s",
                note="" if sparse < dense else f"the densest load still leaves the batch as empty ({pct(dense)})."),
        Finding(claim="the batch fill ratio falls when tiering is too conservative", seed_figure="falls",
                setting=f"{p.backlog_requests} standard requests queued, premium_reserved_slots "
                        f"{', '.join(map(str, p.reserved_slots))} of {p.max_num_seqs}, no premium traffic",
                measured=", ".join(f"{pct(v['fill'])} at {k}" for k, v in by_reserved.items()), value=held,
                holds=held < open_, rule=f"fill while requests queue with {k1} reserved < with {k0}",
                note="" if held < open_ else "the reservation was not the limit here (KV or the queue was)."),
    ]
    plot = Plot("batch fill ratio", "arrival rate (req/s) / reserved slots", "fill (%)", kind="line")
    plot.add("by arrival rate", list(p.rates_rps), [v["fill"] * 100 for v in by_rate.values()])
    plot.add("by premium_reserved_slots", list(p.reserved_slots), [v["fill"] * 100 for v in by_reserved.values()])
    return ExperimentResult("batch-fill", "Batch fill ratio", asdict(p), findings,
                            {"by_rate": {str(k): v for k, v in by_rate.items()},
                             "by_reserved_slots": {str(k): v for k, v in by_reserved.items()}}, plot)
