"""Interactive and batch traffic on one engine: priority tiers with vs without, and one mixed instance vs
two separated ones. Interactive requests arrive as a Poisson stream; batch requests are a backlog queued at
t = 0 (offline jobs) that outlasts the stream."""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass

from engine.core.engine import Engine
from engine.experiments.drive import Arrival, Replay, config, mean, poisson_times, prompt, quantile, replay
from engine.experiments.result import ExperimentResult, Finding, Plot, pct


@dataclass(frozen=True)
class Traffic:
    interactive_rps: float = 8.0
    duration_s: float = 15.0  # of the interactive stream
    interactive_prompt: tuple[int, int] = (32, 128)
    interactive_output: tuple[int, int] = (16, 32)
    batch_requests: int = 160
    batch_prompt: tuple[int, int] = (128, 384)
    batch_output: tuple[int, int] = (128, 256)
    seed: int = 0


def traffic(t: Traffic, interactive_tier: str, batch_tier: str) -> list[Arrival]:
    rng = random.Random(t.seed)
    out = [Arrival(0.0, prompt(rng, rng.randint(*t.batch_prompt)), rng.randint(*t.batch_output), batch_tier, "batch")
           for _ in range(t.batch_requests)]
    for at in poisson_times(t.interactive_rps, t.duration_s, rng):
        out.append(Arrival(at, prompt(rng, rng.randint(*t.interactive_prompt)), rng.randint(*t.interactive_output),
                           interactive_tier, "interactive"))
    return out


def _engine(model: str, slots: int, seed: int) -> Engine:
    # no admission control: these claims are about scheduling, not about refusing work (see the overload one)
    return Engine(config(model=model, max_num_seqs=slots, seed=seed))


def _figures(r: Replay) -> dict:
    inter, batch = r.of("interactive"), r.of("batch")
    tokens = sum(o.output_tokens for o in r.outcomes)
    batch_end = max((o.finished_s for o in batch if o.finished_s is not None), default=None)
    return {"interactive_mean_queue_ms": mean([o.queue_ms for o in inter]),
            "interactive_p99_queue_ms": quantile([o.queue_ms for o in inter], 0.99),
            "interactive_p99_ttft_ms": quantile([o.ttft_ms for o in inter], 0.99),
            "interactive_mean_queue_steps": mean([o.queue_steps for o in inter]),
            "batch_mean_queue_steps": mean([o.queue_steps for o in batch]),
            "batch_completion_s": batch_end,
            "batch_tok_s": sum(o.output_tokens for o in batch) / batch_end if batch_end else 0.0,
            "total_tok_s": tokens / r.wall_s, "wall_s": r.wall_s, "preemptions": r.num_preemptions,
            "interactive": len(inter), "batch": len(batch)}


@dataclass(frozen=True)
class TierParams:
    model: str = "tiny"
    traffic: Traffic = Traffic()
    max_num_seqs: int = 32


def priority_tiers(p: TierParams) -> ExperimentResult:
    def run(interactive_tier: str, batch_tier: str) -> dict:
        engine = _engine(p.model, p.max_num_seqs, p.traffic.seed)
        return _figures(replay(engine, traffic(p.traffic, interactive_tier, batch_tier)))

    tiered, flat = run("premium", "basic"), run("standard", "standard")
    q99 = tiered["interactive_p99_queue_ms"]
    later = tiered["batch_completion_s"] / flat["batch_completion_s"] - 1
    tput = tiered["total_tok_s"] / flat["total_tok_s"] - 1
    setting = (f"{p.traffic.interactive_rps:g} interactive req/s (premium) beside {p.traffic.batch_requests} queued "
               f"batch requests (basic), {p.max_num_seqs} slots; without tiers all are standard, first come first "
               "served")
    mean_step = tiered["wall_s"] / max(1, tiered["interactive"])
    findings = [
        Finding(claim="interactive requests queue for tens of milliseconds while batch requests fill the rest",
                seed_figure="tens of ms", setting=setting,
                measured=f"p99 queue {q99:.0f} ms with tiers vs {flat['interactive_p99_queue_ms']:.0f} ms without",
                value=q99, holds=q99 < 100, rule="interactive p99 queue time < 100 ms with tiers",
                note="" if q99 < 100 else
                f"{q99:.0f} ms is {q99 / 100:.1f}x the bound: an interactive request waits for a step where it may "
                f"join the batch (mean {tiered['interactive_mean_queue_steps']:.1f} steps) and steps here run long "
                f"next to the TTFT (about {mean_step * 1e3:.0f} ms of run per interactive arrival)."),
        Finding(claim="batch completion is only slightly later with tiers", seed_figure="slightly later",
                setting="the last batch request's finish, with vs without tiers",
                measured=f"{tiered['batch_completion_s']:.1f} vs {flat['batch_completion_s']:.1f} s: "
                         f"{'+' if later >= 0 else ''}{pct(later)}",
                value=later, holds=later <= 0.10, rule="batch completion at most 10% later",
                note="" if later <= 0.10 else
                f"+{pct(later)}: {tiered['preemptions']} preemptions of batch requests for interactive ones "
                "recompute or move their KV, work the flat run does not do."),
        Finding(claim="total throughput is unchanged by tiers", seed_figure="unchanged", setting="output tokens/s of "
                "the whole run", measured=f"{tiered['total_tok_s']:.0f} vs {flat['total_tok_s']:.0f} tok/s: "
                f"{'+' if tput >= 0 else ''}{pct(tput)}", value=tput, holds=abs(tput) <= 0.10,
                rule="within 10%", note="" if abs(tput) <= 0.10 else
                f"{pct(abs(tput))} apart: the runs end at different times (batch completion above), and preempted "
                "requests redo their prefill."),
    ]
    plot = Plot("interactive queue time and batch completion, with vs without tiers", "", "value")
    plot.add("interactive p99 queue (ms)", ["tiers", "no tiers"],
             [tiered["interactive_p99_queue_ms"], flat["interactive_p99_queue_ms"]])
    plot.add("batch completion (s x 100)", ["tiers", "no tiers"],
             [tiered["batch_completion_s"] * 100, flat["batch_completion_s"] * 100])
    params = {**asdict(p), "interactive_tier": "premium", "batch_tier": "basic"}
    return ExperimentResult("priority-tiers", "Priority tiers", params, findings,
                            {"with_tiers": tiered, "without_tiers": flat}, plot)


# A side is happy with what it would get separated: interactive its TTFT promise, batch its throughput, within
# the 10% that counts as "unchanged" in the tiers claims above. Exact equality would call batch unhappy over
# run-to-run noise and so favour the claim.
BATCH_TOLERANCE = 0.10


@dataclass(frozen=True)
class MixParams:
    model: str = "tiny"
    traffic: Traffic = Traffic(duration_s=10.0, batch_requests=128)
    mixed_slots: tuple[int, ...] = (8, 32, 64)  # how the mixed instances are tuned: batch slots ...
    # ... and (interactive tier, batch tier): the same tier for both (first come first served), or priority tiers
    mixed_tiers: tuple[tuple[str, str], ...] = (("standard", "standard"), ("premium", "basic"), ("premium", "standard"))
    interactive_slots: int = 16
    batch_slots: int = 64
    interactive_ttft_slo_ms: float = 300.0


def _mixed_name(slots: int, tiers: tuple[str, str]) -> str:
    return f"mixed, {slots} slots" + ("" if tiers[0] == tiers[1] else f", tiers {tiers[0]}/{tiers[1]}")


def mixed_vs_separated(p: MixParams) -> ExperimentResult:
    """Two instances either way: mixed, each takes half of both streams (one simulated, the other is its
    twin), tuned by its batch slots and by priority tiers; separated, one takes all interactive traffic and
    the other all batch traffic."""
    runs: dict[str, dict] = {}
    for tiers in p.mixed_tiers:
        half = traffic(p.traffic, *tiers)[::2]
        for slots in p.mixed_slots:
            f = _figures(replay(_engine(p.model, slots, p.traffic.seed), half))
            runs[_mixed_name(slots, tiers)] = {**f, "deployment_batch_tok_s": 2 * f["batch_tok_s"]}
    arrivals = traffic(p.traffic, "standard", "standard")
    inter = _figures(replay(_engine(p.model, p.interactive_slots, p.traffic.seed),
                            [a for a in arrivals if a.label == "interactive"]))
    batch = _figures(replay(_engine(p.model, p.batch_slots, p.traffic.seed),
                            [a for a in arrivals if a.label == "batch"]))
    separated = {"interactive_p99_ttft_ms": inter["interactive_p99_ttft_ms"],
                 "deployment_batch_tok_s": batch["batch_tok_s"], "interactive_instance": inter, "batch_instance": batch}
    finding = mix_finding(p, runs, separated)
    names = [*runs, "separated"]
    plot = Plot("interactive p99 TTFT and batch throughput per deployment", "deployment", "value")
    plot.add("interactive p99 TTFT (ms)", names,
             [r["interactive_p99_ttft_ms"] for r in runs.values()] + [separated["interactive_p99_ttft_ms"]])
    plot.add("batch tok/s", names, [r["deployment_batch_tok_s"] for r in runs.values()]
             + [separated["deployment_batch_tok_s"]])
    return ExperimentResult("mixed-vs-separated", "Mixed vs separated interactive and batch traffic", asdict(p),
                            [finding], {"mixed": runs, "separated": separated}, plot)


def mix_finding(p: MixParams, runs: dict[str, dict], separated: dict) -> Finding:
    """The claim holds if no mixed tuning keeps both sides happy and the separated deployment does."""
    slo, target = p.interactive_ttft_slo_ms, separated["deployment_batch_tok_s"]
    floor = (1 - BATCH_TOLERANCE) * target

    def happy(r: dict) -> tuple[bool, bool]:
        p99 = r["interactive_p99_ttft_ms"]
        return p99 is not None and p99 <= slo, r["deployment_batch_tok_s"] >= floor

    both = [name for name, r in runs.items() if all(happy(r))]
    sep_ok = separated["interactive_p99_ttft_ms"] is not None and separated["interactive_p99_ttft_ms"] <= slo
    summary = "; ".join(f"{name}: p99 TTFT {_ms(r['interactive_p99_ttft_ms'])}, batch "
                        f"{r['deployment_batch_tok_s']:.0f} tok/s" for name, r in runs.items())
    tiered = [name for name in runs if ", tiers " in name]
    if both:
        r = runs[both[0]]
        why = ("priority tiers let an interactive request pass the batch backlog" if both[0] in tiered else
               "with enough slots for the backlog an interactive request finds a free slot at once, and the tiny "
               "model's steps stay short even full")
        note = (f"{len(both)} of {len(runs)} mixed tunings kept both sides happy ({'; '.join(both)}). {both[0]}: "
                f"p99 TTFT {r['interactive_p99_ttft_ms']:.0f} <= {slo:g} ms, batch {r['deployment_batch_tok_s']:.0f} "
                f">= {floor:.0f} tok/s: {why}.")
    elif not sep_ok:
        note = (f"separated, the interactive instance itself misses {slo:g} ms (p99 "
                f"{_ms(separated['interactive_p99_ttft_ms'])}): the interactive load alone is too much for one "
                "instance of this CPU.")
    else:
        note = ""
    tunings = ", ".join(f"{a}/{b}" if a != b else f"all {a}" for a, b in p.mixed_tiers)
    return Finding(
        claim="interactive and batch traffic mixed in one instance leave one side unhappy however it is tuned; "
              "separated, both are served", seed_figure="one side stays unhappy",
        setting=f"two instances; interactive promise p99 TTFT <= {slo:g} ms, batch wants the separated deployment's "
                f"{target:.0f} tok/s (within {pct(BATCH_TOLERANCE)}); mixed tuned to "
                f"{', '.join(map(str, p.mixed_slots))} slots x tiers (interactive/batch) {tunings}",
        measured=f"{summary}; separated: p99 TTFT {_ms(separated['interactive_p99_ttft_ms'])}, batch "
                 f"{target:.0f} tok/s",
        value=float(len(both)), holds=not both and sep_ok,
        rule=f"no mixed tuning (slots and tiers) meets both the TTFT promise and {pct(1 - BATCH_TOLERANCE)} of the "
             "separated batch throughput, and separation meets the promise", note=note)


def _ms(x: float | None) -> str:
    return "none" if x is None else f"{x:.0f} ms"
