"""What decides a capacity window near chat.yaml's knee: its mean offered rate, or its busiest few seconds?

    python bench/window_bursts.py [--scenario loadgen/scenarios/chat.yaml] [--loads 46 50 54] [--windows 6]
                                  [--bursts 2 4 8] [--out bench/results/window-bursts.json]

1. **Measure.** One embedded engine; every load ``--windows`` times, each window whole (no early stop), each
   on its own arrival draw, with the search's own step machinery (``knee_windows.measure``, which runs
   ``bench/sweep.py``'s ``measure_fixed``); the loads shuffled in each round.
2. **Per window**, from the arrivals it was sent: the offered rate over the judged window, and for each
   ``--bursts`` length B the busiest B seconds' rate (``local_B``: the most arrivals in any B-second span
   that overlaps the window, over B; a burst just before the window still queues into it).
3. **Which predicts the verdict.** The logistic fit P(fail) = 1 / (1 + exp(-(a + b log x))) on each
   predictor x (``capacity.crossing.logistic_fit``), with its log-likelihood: the larger, the better x
   separates the passing windows from the failing ones. ``None`` where the windows separate completely
   (no finite slope).
4. **What longer windows should rate**, under two models, each as the load at which half of the windows of
   each ``--window-lengths`` pass and its ratio to the first length's:
   - ``bursts``: a window fails when its busiest B seconds exceed R (the best burst predictor's half-fail
     rate), by simulation of Poisson arrivals;
   - ``excursions``: failures are events that come independently in time at a rate that grows with the load,
     so a window of length L passes with P(pass at the measured length) ^ (L / measured length), P from the
     offered-rate fit.
   To read beside the ratings of 20 s and 40 s steps (``capacity-seeds-40s-steps.json`` and the default runs).

``--from FILE`` re-analyses a results file's windows (nothing is measured again).
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]

from knee_windows import measure  # noqa: E402  (bench/: the same sweep, shuffled rounds on one engine)

from loadgen.capacity.crossing import logistic_fit  # noqa: E402
from loadgen.results.records import read_records  # noqa: E402
from loadgen.results.runmeta import git_commit, machine, now_iso, versions  # noqa: E402
from loadgen.scenario.parse import load_scenario  # noqa: E402


def busiest_rate(arrivals: np.ndarray, w0: float, w1: float, burst_s: float) -> float:
    """The most arrivals in any ``burst_s`` span that overlaps [w0, w1), per second (a span may begin up to
    ``burst_s`` before the window: a burst just before it still queues into it)."""
    starts = arrivals[(arrivals >= w0 - burst_s) & (arrivals < w1)]
    if starts.size == 0:
        return 0.0
    # the busiest span starts at an arrival: count the arrivals in [a, a + burst_s) for each one
    counts = np.searchsorted(arrivals, starts + burst_s, side="left") - np.searchsorted(arrivals, starts, side="left")
    return float(counts.max()) / burst_s


def window_rows(details: list[dict], records: list[dict], bursts: list[float]) -> list[dict]:
    rows = []
    for i, d in enumerate(details):
        w0, w1 = d["window_s"]
        arrivals = np.sort(np.array([r["scheduled_s"] for r in records if r.get("stage") == i], dtype=float))
        inside = int(((arrivals >= w0) & (arrivals < w1)).sum())
        rows.append({"load": d["load"], "passed": bool(d["passed"]), "window_s": w1 - w0,
                     "offered_rps": inside / (w1 - w0) if w1 > w0 else None,
                     "local_rps": {f"{b:g}": busiest_rate(arrivals, w0, w1, b) for b in bursts}})
    return rows


def fit(x: list[float], failed: list[bool]) -> dict:
    xs, ys = np.array(x, dtype=float), np.array([1.0 if f else 0.0 for f in failed])
    ab = logistic_fit(xs, ys, np.ones_like(xs))
    if ab is None or not ab[1] > 0:
        return {"a": None, "b": None, "half_fail_rps": None, "log_likelihood": None}
    a, b = ab
    p = np.clip(1.0 / (1.0 + np.exp(-(a + b * np.log(xs)))), 1e-9, 1 - 1e-9)
    return {"a": a, "b": b, "half_fail_rps": math.exp(-a / b),
            "log_likelihood": float((ys * np.log(p) + (1 - ys) * np.log(1 - p)).sum())}


def pass_share(rate: float, window_s: float, burst_s: float, threshold_rps: float, sims: int,
               rng: np.random.Generator) -> float:
    """The share of Poisson windows whose busiest ``burst_s`` seconds stay at or below ``threshold_rps``."""
    ok = 0
    for _ in range(sims):
        n = rng.poisson(rate * (window_s + burst_s))
        arrivals = np.sort(rng.uniform(-burst_s, window_s, n))
        ok += busiest_rate(arrivals, 0.0, window_s, burst_s) <= threshold_rps
    return ok / sims


def half_pass_rate(window_s: float, burst_s: float, threshold_rps: float, sims: int, seed: int) -> float:
    """The Poisson rate at which half the windows of ``window_s`` pass (bisection on a common random seed)."""
    lo, hi = 0.5 * threshold_rps, threshold_rps
    for _ in range(14):
        mid = 0.5 * (lo + hi)
        if pass_share(mid, window_s, burst_s, threshold_rps, sims, np.random.default_rng(seed)) >= 0.5:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", default=str(REPO / "loadgen" / "scenarios" / "chat.yaml"))
    ap.add_argument("--loads", type=float, nargs="+", default=[46.0, 50.0, 54.0])
    ap.add_argument("--windows", type=int, default=6, help="windows per load")
    ap.add_argument("--bursts", type=float, nargs="+", default=[2.0, 4.0, 8.0], help="burst lengths (s)")
    ap.add_argument("--window-lengths", type=float, nargs="+", default=[16.0, 36.0],
                    help="judged window lengths to predict the half-pass rate of (s)")
    ap.add_argument("--sims", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--from", dest="from_file", type=Path, help="re-analyse this results file")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "window-bursts.json")
    args = ap.parse_args()
    if args.from_file:
        prev = json.loads(args.from_file.read_text())
        rows, measured = prev["windows_measured"], prev["measured"]
    else:
        scn = load_scenario(args.scenario)
        print(f"measuring {len(args.loads)} loads x {args.windows} windows of {args.scenario} ...", flush=True)
        with tempfile.TemporaryDirectory() as tmp:
            details, _ = measure(scn, args.loads, args.windows, args.seed, Path(tmp))
            records = read_records(Path(tmp) / "sweep" / "requests.jsonl")
        rows = window_rows(details, records, args.bursts)
        measured = {"git_commit": git_commit(), "when": now_iso(), "scenario": args.scenario}
        args.out.write_text(json.dumps({"bench": "window_bursts", "measured": measured,
                                        "windows_measured": rows}, indent=1) + "\n")
    failed = [not r["passed"] for r in rows]
    fits = {"offered": fit([r["offered_rps"] for r in rows], failed)}
    for b in rows[0]["local_rps"]:
        fits[f"local_{b}"] = fit([r["local_rps"][b] for r in rows], failed)
    local = {k: v for k, v in fits.items() if k.startswith("local_") and v["log_likelihood"] is not None}
    measured_s = float(np.median([r["window_s"] for r in rows]))
    prediction: dict = {"measured_window_s": measured_s, "bursts": None, "excursions": None}
    off = fits["offered"]
    if off["b"] is not None:
        # P_L(fail) = 1/2  <=>  P_measured(pass) = (1/2) ** (measured / L)  <=>  a fail share q at the measured length
        rates = {}
        for w in args.window_lengths:
            q = 1.0 - 0.5 ** (measured_s / w)
            rates[f"{w:g}"] = off["half_fail_rps"] * (q / (1.0 - q)) ** (1.0 / off["b"])
        first = rates[f"{args.window_lengths[0]:g}"]
        prediction["excursions"] = {"half_pass_rps": rates, "ratio_to_first": {w: r / first for w, r in rates.items()}}
    if local:
        best = max(local, key=lambda k: local[k]["log_likelihood"])
        burst_s, threshold = float(best.removeprefix("local_")), local[best]["half_fail_rps"]
        rates = {f"{w:g}": half_pass_rate(w, burst_s, threshold, args.sims, args.seed) for w in args.window_lengths}
        first = rates[f"{args.window_lengths[0]:g}"]
        prediction["bursts"] = {"predictor": best, "threshold_rps": threshold, "half_pass_rps": rates,
                                "ratio_to_first": {w: r / first for w, r in rates.items()}}
    out = {"bench": "window_bursts", "when": now_iso(), "git_commit": git_commit(), "measured": measured,
           "machine": machine(), "versions": versions(), "loads": args.loads, "windows": args.windows,
           "bursts_s": args.bursts, "fits": fits, "prediction": prediction, "windows_measured": rows}
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({"fits": fits, "prediction": prediction}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
