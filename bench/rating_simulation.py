"""The capacity search and its rating against the calibration queue, simulated exactly, over many seeds:
how accurate, how spread and how honest the rating and its interval are, free of machine noise.

    python bench/rating_simulation.py [--scenario loadgen/scenarios/calibrate.yaml] [--runs 99] [--refine 10 20 40]
                                      [--designs fresh common] [--prefix-s 0] [--window-counts exact|drawn]
                                      [--no-floor]
                                      [--out bench/results/rating-simulation.json]

Each run is the real search (``CapacitySearch`` with the scenario's ``search`` section) and the real rating
(``capacity.rating.rate``) on steps whose windows are computed, not measured: the mock's queueing mode
(``truth.QueueParams()``, calibrate's default) fed a step's own arrival draw, from an empty queue, for
``step_duration_s``, the requests scheduled in the first ``warmup_s`` not judged. What it leaves out: early
stopping (every step runs its whole length), the steady-state warm-up, the client. Both arrival designs
(``search.arrivals``: ``fresh``, ``common``) run on the same seeds, and the fresh design again with
``--refine`` more windows at the estimate (``search.refine_steps``; ``refine`` in the file). ``--prefix-s``
starts every step's window from the queue's steady state at its load instead of an idle queue: what the
idle start costs. ``--window-counts drawn`` lets each window's arrival count be the process's own draw
instead of exactly load x its length (``search.window_counts``): what the exact counts change.

Per design: the error (rated / true - 1) of the search's pass end (``rate_rps``) and of the rating's
``estimate`` (mean, sd, the share within 3 %), the spread ((max - min) / median) of each run of three
consecutive seeds (median and 90th percentile over those triples), how often the interval holds the truth
and how often it holds the other runs' estimates. ``floor``: the load sd of the best any estimate can do
with k windows of the step's length, all at the true capacity with the curve's slope known (the window
share's sd / sqrt(k) / the slope of the share against log load): what a fixed budget of windows allows;
and how often one window's own quantile passes at the truth and 5, 10, 16 % above it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]

from loadgen.capacity import rating  # noqa: E402
from loadgen.capacity.truth import QueueParams, QueueTruth, SimulatedSteps, latencies  # noqa: E402
from loadgen.results.latency import quantile  # noqa: E402
from loadgen.results.runmeta import git_commit, machine, now_iso, versions  # noqa: E402
from loadgen.results.sequential import clusters  # noqa: E402
from loadgen.scenario.options import StepOptions  # noqa: E402
from loadgen.scenario.parse import load_scenario  # noqa: E402


def one_run(win: SimulatedSteps, arrivals: str, seed: int, refine_steps: int = 0) -> dict:
    steps, rated = win.search(seed, dataclasses.replace(win.scn.search, arrivals=arrivals, refine_steps=refine_steps))
    r = rating.rate(steps, seed=seed)
    return {"seed": seed, "steps": len(steps), "rate_rps": rated,
            "estimate": r["estimate"], "ci": [r["ci_low"], r["ci_high"]], "ci_unbounded": r["ci_unbounded"],
            "fit": r["fit"]}


def describe(runs: list[dict], truth: float) -> dict:
    out: dict = {}
    for key in ("rate_rps", "estimate"):
        e = np.asarray([r[key] / truth - 1.0 for r in runs if r[key] is not None])
        triples = [np.asarray([r[key] for r in runs[i:i + 3]]) for i in range(0, len(runs) - 2, 3)]
        spreads = [(t.max() - t.min()) / np.median(t) for t in triples]
        out[key] = {"mean_error": float(e.mean()), "sd_error": float(e.std()),
                    "within_3pct": float(np.mean(abs(e) <= 0.03)),
                    "spread_of_three_median": float(np.median(spreads)), "spread_of_three_p90": quantile(spreads, 0.9),
                    "triples_within_5pct": float(np.mean(np.asarray(spreads) <= 0.05))}
    est = np.asarray([r["estimate"] for r in runs])
    # an unbounded end holds whatever lies beyond it
    lo = np.asarray([-math.inf if "low" in r.get("ci_unbounded", []) else r["ci"][0] for r in runs])
    hi = np.asarray([math.inf if "high" in r.get("ci_unbounded", []) else r["ci"][1] for r in runs])
    others = [float(np.mean((lo[i] <= np.delete(est, i)) & (np.delete(est, i) <= hi[i]))) for i in range(len(runs))]
    out["interval"] = {"holds_truth": float(np.mean((lo <= truth) & (truth <= hi))),
                       "holds_others": float(np.mean(others)),
                       "median_width": float(np.median([(r["ci"][1] - r["ci"][0]) / truth for r in runs])),
                       "unbounded": float(np.mean([bool(r.get("ci_unbounded")) for r in runs]))}
    out["logistic_fits"] = float(np.mean([r["fit"] == "logistic" for r in runs]))
    return out


def floor(win: SimulatedSteps, truth: float, windows: list[int], draws: int = 1500) -> dict:
    at = [win.ttfts(9_000_000 + s, truth)[0] > win.threshold for s in range(draws)]  # windows at the truth
    shares = np.asarray([v.mean() for v in at])
    big = [win.ttfts(8_000_000 + s, truth * f)[0] for f in (0.97, 1.03) for s in range(draws // 4)]
    lo = np.mean([np.mean(v > win.threshold) for v in big[:draws // 4]])
    hi = np.mean([np.mean(v > win.threshold) for v in big[draws // 4:]])
    slope = (hi - lo) / math.log(1.03 / 0.97)  # d share / d log load at the truth
    passes = []
    for f in (1.0, 1.05, 1.10, 1.16):  # how often one window's own quantile passes, at and above the truth
        ok = [quantile(win.ttfts(7_000_000 + s, truth * f)[0], win.quantile) <= win.threshold
              for s in range(draws // 2)]
        passes.append({"load_over_truth": f, "windows_passing": float(np.mean(ok))})
    runs = np.asarray([clusters(v, StepOptions().decluster_run) for v in at])  # runs of exceedances
    return {"window_passes": passes, "window_share_mean": float(shares.mean()), "window_share_sd": float(shares.std()),
            "window_share_se": float(shares.std() / math.sqrt(draws)),
            "window_exceedance_runs_mean": float(runs.mean()), "windows_without_exceedance": float(np.mean(runs == 0)),
            "pooled_log_bias": pooled_log_bias(win, truth),
            "binomial_sd": float(math.sqrt(shares.mean() * (1 - shares.mean()) / max(1, win.ttfts(1, truth)[0].size))),
            "slope_per_log_load": float(slope), "draws": draws,
            "by_windows": [{"windows": k, "load_sd": float(shares.std() / math.sqrt(k) / slope)} for k in windows]}


def pooled_log_bias(win: SimulatedSteps, truth: float, k: int = 20, repeats: int = 150) -> dict:
    """Where the estimate's upward bias comes from: k windows at 0.97 and k at 1.03 x the truth, pooled per
    load, ``repeats`` times. A window's share is unbiased, but the log of a pooled share is not, and less so
    at the higher load (more runs of exceedances, less skewed): the fitted slope comes out steeper than the
    slope of the means, and the line meets the level too high."""
    lo, hi = [], []
    for r in range(repeats):
        for f, out in ((0.97, lo), (1.03, hi)):
            v = [win.ttfts(6_000_000 + 1000 * r + 2 * i + (f > 1), truth * f)[0] > win.threshold for i in range(k)]
            out.append(sum(x.sum() for x in v) / max(1, sum(x.size for x in v)))
    lo_, hi_ = np.asarray(lo), np.asarray(hi)
    ok = (lo_ > 0) & (hi_ > 0)
    span = math.log(1.03 / 0.97)
    return {"windows_per_load": k, "repeats": repeats,
            "share_mean": [float(lo_.mean()), float(hi_.mean())],
            "log_bias": [float(np.log(lo_[ok]).mean() - math.log(lo_.mean())),
                         float(np.log(hi_[ok]).mean() - math.log(hi_.mean()))],
            "slope_of_means": float(math.log(hi_.mean() / lo_.mean()) / span),
            "mean_fitted_slope": float(np.mean(np.log(hi_[ok] / lo_[ok])) / span)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="the capacity search and rating against the exactly simulated "
                                             "calibration queue: accuracy, spread, interval coverage")
    ap.add_argument("--scenario", type=Path, default=REPO / "loadgen" / "scenarios" / "calibrate.yaml")
    ap.add_argument("--runs", type=int, default=99, help="seeds per arrival design (default 99: 33 triples)")
    ap.add_argument("--refine", type=int, nargs="*", default=[10, 20, 40],
                    help="search.refine_steps to measure beside the default 0 (fresh draws; default 10 20 40)")
    ap.add_argument("--designs", nargs="+", choices=("fresh", "common"), default=["fresh", "common"],
                    help="the arrival designs to run (default both)")
    ap.add_argument("--prefix-s", type=float, default=0.0,
                    help="feed each step's queue this many seconds of its load first: windows from the queue's "
                         "steady state, not an idle one (default 0: as slobench's steps start)")
    ap.add_argument("--window-counts", choices=("exact", "drawn"), default=None,
                    help="search.window_counts for every run (default: the scenario's): each window's arrival "
                         "count fixed at load x its length, or the process's own draw")
    ap.add_argument("--no-floor", action="store_true", help="skip the statistical floor (slow with --prefix-s)")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "rating-simulation.json")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    scn = load_scenario(args.scenario)
    if args.window_counts:
        scn.search = dataclasses.replace(scn.search, window_counts=args.window_counts)
    q = QueueParams()
    qt = QueueTruth(scn, q, requests=50_000, seeds=4)
    truth = qt.capacity()
    steady = np.concatenate([latencies(d.arrive / truth, d.n_in, d.n_out, q)["ttft_ms"][qt.skip:] for d in qt.draws])
    win = SimulatedSteps(scn, q, prefix_s=args.prefix_s)
    designs = {}
    for arrivals in args.designs:
        runs = []
        for seed in range(args.runs):
            runs.append(one_run(win, arrivals, seed))
            if (seed + 1) % 20 == 0:
                print(f"  {arrivals}: {seed + 1}/{args.runs} runs", file=sys.stderr, flush=True)
        designs[arrivals] = {"summary": describe(runs, truth), "runs": runs}
        print(f"{arrivals}: {json.dumps(designs[arrivals]['summary'])}", file=sys.stderr, flush=True)
    refine = {}
    for k in args.refine:
        runs = [one_run(win, "fresh", seed, refine_steps=k) for seed in range(args.runs)]
        refine[str(k)] = {"summary": describe(runs, truth), "runs": runs}
        print(f"refine_steps {k}: {json.dumps(refine[str(k)]['summary'])}", file=sys.stderr, flush=True)
    result = {"bench": "rating-simulation", "started_at": now_iso(), "git_commit": git_commit(), "machine": machine(),
              "versions": versions(), "scenario": str(args.scenario), "queue": q.as_dict(), "true_rps": truth,
              "step_duration_s": win.duration_s, "warmup_s": win.warmup_s, "prefix_s": args.prefix_s,
              "window_counts": scn.search.window_counts,
              "runs": args.runs, "designs": designs, "refine": refine,
              "floor": None if args.no_floor else floor(win, truth, [4, 8, 12, 20, 40, 80, 160]),
              "steady_state_share_at_truth": float(np.mean(steady > win.threshold)),
              "wall_s": round(time.monotonic() - t0, 1)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"written to {args.out} in {result['wall_s']} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
