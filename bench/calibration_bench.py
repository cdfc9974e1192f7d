"""The capacity search against a target of known capacity: ``slobench calibrate`` with its default settings
for several seeds, rated vs true.

    python bench/calibration_bench.py [--scenario loadgen/scenarios/calibrate.yaml] [--seeds 0 1 2]
                                      [--out bench/results/calibration.json] [-- EXTRA calibrate FLAGS]

Each seed is one ``slobench calibrate`` run as a user runs it (a subprocess: its own mock in queueing mode,
the exact simulation's true capacity, the ordinary capacity search), with the seed as the scenario's arrival
pattern. Written to calibration.json: per seed the rated and true capacity (req/s), the error (rated /
true - 1), what a search trusting one window per step, judged perfectly, would rate on that seed (``ideal``: the
noise of one window's verdict), the verdict, steps and wall time, and the rating's estimate from the windows
that ran whole alone (``estimate_whole_windows_error``: a step stopped at its breach has its run of
exceedances cut short); overall the largest |error| and the spread of the ratings ((max - min) / median),
and the same of the rating's ``estimate`` with how many of the other runs' estimates each run's interval
holds (``estimate``). Goals from the issue: every |error| <= 3% and spread <= 5%.

Extra flags after ``--`` go to every ``slobench calibrate`` run (e.g. ``-- --set search.step_duration_s=10``
for a quick look; the goals are for the defaults).

``floor`` (after the runs, pure simulation): what a *perfect* judge of one step's window would rate, over
``--floor-seeds`` arrival draws, for steps of several lengths (``--floor-steps``): the error no search over
single steps of that length can avoid, and the shortest length whose 90th percentile |error| is within 3 %.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

from loadgen.capacity import rating  # noqa: E402
from loadgen.results.runmeta import git_commit, machine, now_iso, versions  # noqa: E402


def run_seed(scenario: Path, seed: int, extra: list[str], work: Path) -> dict:
    out = work / f"seed-{seed}"
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "loadgen.cli", "calibrate", str(scenario), "--seed", str(seed),
                        "--out", str(out), "--no-progress", "--no-report", *extra], cwd=REPO, capture_output=True,
                       text=True)
    wall = time.monotonic() - t0
    if r.returncode != 0 or not (out / "summary.json").exists():
        return {"seed": seed, "returncode": r.returncode, "wall_s": round(wall, 1), "error_text": r.stderr[-2000:]}
    s = json.loads((out / "summary.json").read_text())
    cal = s["calibration"]
    ideal = cal.get("ideal") or {}
    whole = rating.estimate([st for st in s["steps"] if not st.get("stopped_early")])  # windows run whole only
    return {"seed": seed, "returncode": r.returncode, "verdict": s["verdict"], "rated_rps": cal["rated_rps"],
            "true_rps": cal["true_capacity_rps"], "error": cal["error"], "ideal_rated_rps": ideal.get("rated_rps"),
            "ideal_error": ideal.get("error"), "ideal_sd_error": ideal.get("sd_error"),
            "errors": cal.get("errors"), "interval": cal.get("interval"),
            "interval_unbounded": cal.get("interval_unbounded") or [],
            "estimate_whole_windows_error": whole / cal["true_capacity_rps"] - 1 if whole else None,
            "stopped_early_steps": sum(1 for st in s["steps"] if st.get("stopped_early")),
            "truth_in_interval": cal.get("truth_in_interval"), "steps": len(s["steps"]),
            "run_duration_s": s.get("duration_s"),
            "wall_s": round(wall, 1), "valid": s.get("valid")}


def result_true(runs: list[dict]) -> float | None:
    return next((r["true_rps"] for r in runs if r.get("true_rps")), None)


def floor(scenario: Path, true_rps: float | None, lengths: list[float], seeds: int) -> dict | None:
    """A perfect judge's rating error over ``seeds`` draws for single steps of each length (the mock's
    default queue, the scenario's warm-up floor)."""
    import numpy as np

    from loadgen.capacity.settings import CapacitySettings
    from loadgen.capacity.truth import QueueParams, ideal_step_ratings
    from loadgen.results.latency import quantile
    from loadgen.scenario.parse import load_scenario

    if not lengths:
        return None
    scn = load_scenario(scenario)
    if not true_rps:  # no runs: the truth as `slobench calibrate` computes it by default
        from loadgen.capacity.truth import QueueTruth

        true_rps = QueueTruth(scn, QueueParams(), requests=50_000, seeds=4).capacity()
        if not true_rps:
            return None
    warmup = CapacitySettings.from_scenario(scn).step.warmup_s
    rows = []
    for length in lengths:
        errs = ideal_step_ratings(scn, QueueParams(), true_rps, length, warmup, seeds=seeds) / true_rps - 1.0
        rows.append({"step_s": length, "mean_error": float(np.mean(errs)), "sd_error": float(np.std(errs)),
                     "abs_error_p90": quantile(np.abs(errs), 0.9)})
        print(f"  floor: {length:g} s steps: sd {rows[-1]['sd_error']:.3f}, p90 |error| "
              f"{rows[-1]['abs_error_p90']:.3f}", file=sys.stderr, flush=True)
    within = [r["step_s"] for r in rows if r["abs_error_p90"] <= 0.03]
    return {"true_rps": true_rps, "seeds": seeds, "warmup_s": warmup, "by_step": rows,
            "shortest_step_s_within_3pct": min(within) if within else None}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(description="slobench calibrate for several seeds: rated vs true capacity, "
                                             "written to bench/results/calibration.json")
    ap.add_argument("--scenario", type=Path, default=REPO / "loadgen" / "scenarios" / "calibrate.yaml")
    ap.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2],
                    help="arrival seeds, one run each (none: only the floor)")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "calibration.json",
                    help="result file (default bench/results/calibration.json)")
    ap.add_argument("--work", type=Path, help="keep the run folders here (default: a temporary folder)")
    ap.add_argument("--floor-steps", type=float, nargs="*", default=[15, 30, 60, 120, 240],
                    help="step lengths (s) for the perfect-judge floor (none: skip it)")
    ap.add_argument("--floor-seeds", type=int, default=20, help="arrival draws per floor step length")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp)
        runs = []
        for seed in args.seeds:
            print(f"seed {seed}: slobench calibrate {args.scenario} {' '.join(extra)} ...", file=sys.stderr,
                  flush=True)
            runs.append(run_seed(args.scenario, seed, extra, work))
            print(f"  {json.dumps(runs[-1])}", file=sys.stderr, flush=True)
    rated = [r["rated_rps"] for r in runs if r.get("rated_rps") is not None]
    errors = [abs(r["error"]) for r in runs if r.get("error") is not None]
    spread = (max(rated) - min(rated)) / statistics.median(rated) if len(rated) > 1 else None
    with_est = [r for r in runs if (r.get("errors") or {}).get("estimate") is not None]
    est = [r["true_rps"] * (1 + r["errors"]["estimate"]) for r in with_est]
    held = []  # each run's interval against every other run's estimate
    for i, r in enumerate(with_est):
        if r.get("interval"):
            lo, hi = r["interval"]
            held += [lo <= e <= hi for j, e in enumerate(est) if j != i]
    estimate = {"max_abs_error": max(abs(r["errors"]["estimate"]) for r in with_est) if with_est else None,
                "spread": (max(est) - min(est)) / statistics.median(est) if len(est) > 1 else None,
                "intervals_hold_others": [sum(held), len(held)]}
    judged = [r["truth_in_interval"] for r in runs if r.get("truth_in_interval") is not None]
    coverage = {"truth_in_interval": [sum(judged), len(judged)],
                "share": sum(judged) / len(judged) if judged else None,
                "unbounded": sum(1 for r in runs if r.get("interval_unbounded")),
                "median_width": statistics.median([(r["interval"][1] - r["interval"][0]) / r["true_rps"]
                                                   for r in runs if r.get("interval") and r.get("true_rps")] or [0.0]),
                "mean_error": statistics.mean([r["error"] for r in runs if r.get("error") is not None] or [0.0])}
    result = {
        "bench": "calibration", "coverage": coverage, "started_at": now_iso(), "git_commit": git_commit(),
        "machine": machine(),
        "versions": versions(), "scenario": str(args.scenario), "extra_flags": extra, "runs": runs,
        "true_rps": runs[0].get("true_rps") if runs else None, "max_abs_error": max(errors) if errors else None,
        "spread": spread, "estimate": estimate, "goals": {"max_abs_error": 0.03, "spread": 0.05},
        "met": bool(errors) and len(errors) == len(runs) and max(errors) <= 0.03 and spread is not None
        and spread <= 0.05,
        "floor": floor(args.scenario, result_true(runs), args.floor_steps, args.floor_seeds),
        "wall_s": round(time.monotonic() - t0, 1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"max |error| {result['max_abs_error']}, spread {spread} (estimate: {json.dumps(estimate)}); "
          f"written to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
