"""How often a capacity step's early-stop rules decide wrongly at the knee: simulated steps whose true
p-quantile equals the threshold exactly (issue: a rated capacity you can gate on).

Each simulated step is one tier's window as ``capacity.early_stop.StepLooks`` sees it: Poisson arrivals at
``--rate`` req/s over ``--window-s`` s, i.i.d. latencies with P(latency > T) = 1 - p exactly (lognormal,
exponential and Pareto shapes scaled so their p-quantile is T; and an M/M/1 queue's correlated sojourn
times, exponential with their p-quantile at T), looks every ``look_interval_s`` on the
*settled* requests (scheduled at least T ago) and a last look on the whole window, information fraction
= elapsed / (window + T), as the step computes it. Reported per configuration:

- ``false_breach``: the sequential test (``results.sequential.SequentialTest``, alpha 0.05, each spending
  function, runs of exceedances counted once as the step does, and the plain count) ever calls a breach:
  bounded by alpha by construction for independent requests; the *old* rule beside it (the bootstrap
  interval's lower end over T, ``breach_likely`` below, re-tested every 0.5 s with no correction);
  and the same on an M/M/1 queue's correlated latencies, where the plain count's bound fails;
- ``false_pass``: the sequential test's pass side (bounded by alpha too) and the ramp-only clear-pass
  heuristic (pooled quantile under ``pass_margin`` x T over >= 30 settled requests: not bounded; it depends
  on the shape of the tail);
- ``power``: with 3 % of requests over T, how often the sequential test catches the breach and how soon.

    .venv/bin/python bench/early_stop_bench.py --steps 2000 --old-steps 300 --json bench/results/early-stop.json  # 95 s
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]

from loadgen.results import latency  # noqa: E402
from loadgen.results.latency import quantile  # noqa: E402
from loadgen.results.sequential import SPENDING, SequentialTest, clusters, effective_n, norm_ppf  # noqa: E402
from loadgen.results.slo import SLO, bootstrap_ci  # noqa: E402

LOOK_S = 0.5  # StepOptions.look_interval_s
CLEAR_PASS_MIN = 30  # capacity.early_stop.CLEAR_PASS_MIN
RUN = 2  # StepOptions.decluster_run



def breach_likely(settled: Sequence[float] | np.ndarray, slo: SLO, confidence: float = 0.95,
                  min_requests: int = 20, n_boot: int = 400) -> bool:
    """True when the lower end of the confidence interval of the quantile over ``settled`` requests (an
    unbiased sample of the step so far: every request old enough that its outcome against the
    threshold is known) is over the threshold.

    The old early-stop rule, kept here for the comparison: re-tested at every look with no correction for the
    looks, so its false-breach rate is not bounded. Capacity steps decide with ``results.sequential``."""
    v = np.asarray(settled, dtype=float)
    if v.size < min_requests or quantile(v, slo.quantile) <= slo.threshold_ms:
        return False
    low, _ = bootstrap_ci(v, slo.quantile, confidence, n_boot, seed=1)
    return low > slo.threshold_ms


def latencies(shape: str, n: int, thr: float, tail: float, rng: np.random.Generator) -> np.ndarray:
    """n latencies (s) with P(X > thr) = tail exactly."""
    u = rng.random(n)
    if shape == "indicator":  # only the count over the threshold matters to the sequential test
        return np.where(u < tail, 2 * thr, 0.5 * thr)
    if shape == "lognormal":  # sigma 0.5
        mu = math.log(thr) - 0.5 * norm_ppf(1 - tail)
        return np.exp(mu + 0.5 * rng.standard_normal(n))
    if shape == "exponential":
        scale = thr / -math.log(tail)
        return -scale * np.log1p(-u)
    if shape == "pareto":  # alpha 3, x_min chosen so P(X > thr) = tail
        xm = thr * tail ** (1 / 3)
        return xm * (1 - u) ** (-1 / 3)
    raise ValueError(shape)


def mm1_sojourn(sched: np.ndarray, rate: float, thr: float, tail: float, rng: np.random.Generator) -> np.ndarray:
    """Times in system (s) of a FIFO M/M/1 queue started in its stationary state, arrivals at ``sched``:
    its sojourn time is exponential with rate mu - lambda, so mu = lambda + ln(1/tail) / thr puts the
    tail-quantile exactly at ``thr``; successive requests' latencies are correlated, as a queue's are."""
    mu = rate + math.log(1 / tail) / thr
    rho = rate / mu
    w = rng.exponential(1 / (mu - rate)) if rng.random() < rho else 0.0  # stationary waiting time
    serv = rng.exponential(1 / mu, sched.size)
    out = np.empty(sched.size)
    for i in range(sched.size):
        if i:
            w = max(0.0, w + serv[i - 1] - (sched[i] - sched[i - 1]))
        out[i] = w + serv[i]
    return out


def one_step(rng, rate: float, window_s: float, thr: float, q: float, tail: float, shape: str,
             rules: dict) -> dict[str, tuple[bool, float | None]]:
    """One simulated window: for each rule, (decided, when in s)."""
    n = rng.poisson(rate * window_s)
    sched = np.sort(rng.random(n) * window_s)
    lat = mm1_sojourn(sched, rate, thr, tail, rng) if shape == "mm1" else latencies(shape, n, thr, tail, rng)
    over = lat > thr
    slo = SLO("ttft_ms", thr * 1000, q)
    tests = {k: SequentialTest(q, 0.05, sp) for k, sp in rules.get("sequential", {}).items()}
    out: dict[str, tuple[bool, float | None]] = {}
    span = window_s + thr
    looks = [LOOK_S * k for k in range(1, int(window_s / LOOK_S) + 1)]
    for t in [*looks, None]:  # None: the last look, after the drain
        settled = sched <= (t - thr if t is not None else math.inf)
        ns, no = int(settled.sum()), int(over[settled].sum())
        nc = clusters(over[settled], rules.get("run", 0))
        frac = 1.0 if t is None else min(1.0, t / span)
        for k, ts in tests.items():
            if k in out:
                continue
            if rules["want"] == "pass":  # as StepLooks: the pass side on the effective sample size
                d = ts.look(frac, effective_n(lat[settled]), no, breach_side=False)
            else:  # the breach side on runs of exceedances (a pass stopping first is ignored: conservative)
                d = ts.look(frac, ns, no, pass_side=False, events=nc)
            if d is not None and d == rules["want"]:
                out[k] = (True, t if t is not None else span)
            elif d is not None:
                out[k] = (False, None)  # decided the other (right) way
        if rules.get("old") and "old" not in out and t is not None and breach_likely(lat[settled] * 1000, slo):
            out["old"] = (True, t)
        if (rules.get("clear_pass") and "clear_pass" not in out and t is not None and t >= 2.0
                and ns >= CLEAR_PASS_MIN and effective_n(lat[settled]) >= CLEAR_PASS_MIN
                and latency.quantile(lat[settled], q) <= 0.5 * thr):
            out["clear_pass"] = (True, t)
    return out


def rate_of(rng, steps: int, **kw) -> dict[str, dict]:
    hits: dict[str, list] = {}
    for _ in range(steps):
        res = one_step(rng, **kw)
        for k in list(kw["rules"].get("sequential", {})) + [r for r in ("old", "clear_pass") if kw["rules"].get(r)]:
            hits.setdefault(k, []).append(res.get(k, (False, None)))
    out = {}
    for k, v in hits.items():
        yes = [w for d, w in v if d]
        p = len(yes) / steps
        out[k] = {"rate": round(p, 4), "se": round(math.sqrt(p * (1 - p) / steps), 4), "steps": steps,
                  "mean_decided_at_s": round(float(np.mean(yes)), 2) if yes else None}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=1500, help="simulated steps per configuration (sequential)")
    ap.add_argument("--old-steps", type=int, default=250, help="... for the old (bootstrap) rule: slower")
    ap.add_argument("--window-s", type=float, default=17.0)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    rng = np.random.default_rng(7)
    seq = {sp: sp for sp in SPENDING}
    q = 0.99
    configs = [  # chat.yaml near its knee (~45 req/s): premium ~15 req/s at 300 ms, standard ~30 at 800 ms
        {"rate": 15.0, "thr": 0.3}, {"rate": 30.0, "thr": 0.8}, {"rate": 5.0, "thr": 0.3}]
    out = {"quantile": q, "alpha": 0.05, "look_interval_s": LOOK_S, "window_s": args.window_s, "decluster_run": RUN,
           "false_breach": [], "false_pass": [], "power": []}
    for c in configs:
        kw = dict(rate=c["rate"], window_s=args.window_s, thr=c["thr"], q=q, tail=1 - q)
        brk = {"sequential": seq, "want": "breach", "run": RUN}
        r = rate_of(rng, args.steps, shape="indicator", rules=brk, **kw)
        r0 = rate_of(rng, args.steps, shape="indicator", rules=dict(brk, run=0), **kw)
        old = rate_of(rng, args.old_steps, shape="lognormal", rules={"old": True, "want": "breach"}, **kw)
        # correlated latencies: the count's spread is wider than binomial; runs counted once fix most of it
        queue = rate_of(rng, args.old_steps, shape="mm1", rules=dict(brk, old=True), **kw)
        queue0 = rate_of(rng, args.old_steps, shape="mm1", rules=dict(brk, run=0), **kw)
        out["false_breach"].append({**c, "sequential": r, "sequential_plain_count": r0,
                                    "old_bootstrap_rule": old["old"], "mm1_queue": queue,
                                    "mm1_queue_plain_count": queue0})
        fp = rate_of(rng, args.steps, shape="indicator", rules={"sequential": seq, "want": "pass"}, **kw)
        fpq = rate_of(rng, args.old_steps, shape="mm1", rules={"sequential": seq, "want": "pass"}, **kw)
        heur = {shape: rate_of(rng, args.old_steps, shape=shape, rules={"clear_pass": True, "want": "pass"},
                               **kw)["clear_pass"] for shape in ("lognormal", "exponential", "pareto", "mm1")}
        out["false_pass"].append({**c, "sequential": fp, "mm1_queue": fpq, "clear_pass_heuristic": heur})
        kwp = dict(kw, tail=0.03)  # true p99 well over T: 3 % of requests over it
        pw = rate_of(rng, args.steps // 4, shape="indicator", rules=brk, **kwp)
        out["power"].append({**c, "tail_over_threshold": 0.03, "sequential": pw})
        def rates(d):
            return ", ".join(f"{k} {v['rate']:.3f}" for k, v in d.items())
        print(f"rate {c['rate']:g}/s T {c['thr'] * 1000:g} ms | false breach: {rates(r)}; plain count {rates(r0)}; "
              f"old rule {old['old']['rate']:.3f}; M/M/1 queue: {rates(queue)}; plain count {rates(queue0)}"
              f" | false pass: {rates(fp)}; M/M/1 {rates(fpq)}; clear-pass heuristic {rates(heur)}"
              " | power at 3% over: " + ", ".join(f"{k} {v['rate']:.2f} ({v['mean_decided_at_s']} s)"
                                                  for k, v in pw.items()), flush=True)
    out["elapsed_s"] = round(time.monotonic() - t0, 1)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
