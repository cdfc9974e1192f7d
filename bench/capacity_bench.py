"""Capacity search vs a dense sweep, and the spread of repeated searches, on the reference engine.

    python bench/capacity_bench.py [--scenario loadgen/scenarios/chat.yaml] [--repeats 3] [--points 10]
                                   [--out bench/results/capacity.json]

1. ``--repeats`` full capacity searches (``slobench capacity``'s own code, each with a fresh embedded
   engine, as a user runs it): rated capacity, first failing load, steps, wall time (engine start-up
   excluded, and reported apart).
2. A dense sweep: ``--points`` fixed rates, evenly spaced over [0.5, 1.4] x the median searched rating
   (so the points bracket the capacity; a sweep without that knowledge needs a wider range), each
   measured for the same step duration with the same judgement but no early stop, as a fixed-rate sweep
   runs, against one fresh engine. Its capacity: the highest passing rate below the first failing
   one, and the crossing where the worst SLO margin (judged quantile / threshold) reaches 1, linearly
   interpolated between those two points.
3. Agreement: |search median - sweep crossing| / sweep crossing (goal <= 10%); time ratio: mean search
   wall / sweep wall (goal <= 0.5); spread: (max - min) / median of the searches, and std / mean.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]

from sweep import measure_fixed  # noqa: E402 (this script's own folder)

from loadgen.capacity.run import run_capacity  # noqa: E402
from loadgen.results.runmeta import git_commit, machine, now_iso, versions  # noqa: E402
from loadgen.scenario.parse import load_scenario  # noqa: E402
from loadgen.target.embedded import EmbeddedEngine  # noqa: E402


def margin(step: dict) -> float:
    """Worst judged quantile / threshold over the step's tiers (> 1: the SLO broke)."""
    worst = 0.0
    for e in step["tiers"].values():
        for j in (e.get("judged") or {}).values():
            v = j["value_ms_q"]
            worst = max(worst, float("inf") if v is None else v / j["threshold_ms"])
    return worst


def sweep_capacity(rates: list[float], steps: list[dict]) -> dict:
    passed = [bool(s["passed"]) for s in steps]
    m = [margin(s) for s in steps]
    first_fail = next((i for i, p in enumerate(passed) if not p), None)
    if first_fail is None:
        return {"highest_pass": rates[-1], "crossing": None, "note": "no sweep point failed"}
    if first_fail == 0:
        return {"highest_pass": None, "crossing": None, "note": "every sweep point failed"}
    lo, hi = first_fail - 1, first_fail
    a, b = m[lo], min(m[hi], 10.0)
    cross = rates[lo] + (1.0 - a) / (b - a) * (rates[hi] - rates[lo]) if b > a else rates[lo]
    return {"highest_pass": rates[lo], "first_fail": rates[hi], "crossing": float(cross),
            "non_monotone": any(passed[first_fail:])}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default=str(REPO / "loadgen" / "scenarios" / "chat.yaml"))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--points", type=int, default=10)
    ap.add_argument("--span", type=float, nargs=2, default=(0.5, 1.4), metavar=("LO", "HI"))
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "capacity.json"))
    ap.add_argument("--reports", default=str(REPO / "reports"))
    args = ap.parse_args()

    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = Path(args.reports) / f"bench-capacity-{stamp}"
    result: dict = {"scenario": args.scenario, "started_at": now_iso(), "versions": versions(),
                    "git_commit": git_commit(), "machine": machine(),
                    "command": " ".join(["python", "bench/capacity_bench.py", *sys.argv[1:]]), "searches": []}

    for i in range(args.repeats):
        scn = load_scenario(args.scenario)
        t = time.monotonic()
        res = run_capacity(scn, base / f"search-{i}", progress=False, scenario_path=args.scenario)
        wall = time.monotonic() - t
        s = res.summary
        eng = s.get("engine_start_s") or 0.0
        r = s.get("rated_capacity") or {}
        entry = {"run_dir": str(res.run_dir), "verdict": s["verdict"], "rated_rps": r.get("rate_rps"),
                 "first_fail_rps": s.get("first_fail_load"), "spec_rps": r.get("spec_rate_rps"),
                 "concurrency_measured": r.get("concurrency_measured"),
                 "concurrency_littles_law": r.get("concurrency_littles_law"),
                 "concurrency_agree": r.get("concurrency_agree"), "steps": len(s["steps"]),
                 "early_steps": sum(1 for st in s["steps"] if st.get("stopped_early")),
                 "wall_s": round(wall, 1), "engine_start_s": round(eng, 1), "search_wall_s": round(wall - eng, 1),
                 "valid": s["valid"], "loads": [round(st["load"], 2) for st in s["steps"]],
                 "passed": [st["passed"] for st in s["steps"]]}
        result["searches"].append(entry)
        print(json.dumps(entry), flush=True)
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")

    rated = [e["rated_rps"] for e in result["searches"] if e["rated_rps"]]
    if not rated:
        print("no search produced a rating", file=sys.stderr)
        return 1
    med = statistics.median(rated)
    rates = [float(x) for x in np.linspace(args.span[0] * med, args.span[1] * med, args.points)]
    scn = load_scenario(args.scenario)
    with EmbeddedEngine(scn.engine, log_path=base / "sweep" / "engine.log") as url:
        t = time.monotonic()
        steps = measure_fixed(scn, rates, base / "sweep", target=url, early_stop=False)
        sweep_wall = time.monotonic() - t
    sw = sweep_capacity(rates, steps)
    result["sweep"] = {"run_dir": str(base / "sweep"), "rates": [round(x, 2) for x in rates],
                       "passed": [s["passed"] for s in steps], "margin": [round(margin(s), 3) for s in steps],
                       "wall_s": round(sweep_wall, 1), **sw}
    search_wall = statistics.mean(e["search_wall_s"] for e in result["searches"])
    ref = sw.get("crossing") or sw.get("highest_pass")
    result["comparison"] = {
        "search_rated_median_rps": med,
        "sweep_capacity_rps": ref,
        "agreement": abs(med - ref) / ref if ref else None,
        "search_wall_s_mean": round(search_wall, 1),
        "sweep_wall_s": round(sweep_wall, 1),
        "time_ratio": round(search_wall / sweep_wall, 3),
        "spread_max_min_over_median": (max(rated) - min(rated)) / med,
        "cv": float(np.std(rated) / np.mean(rated)),
        "rated_rps": rated,
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["sweep"]), flush=True)
    print(json.dumps(result["comparison"], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
