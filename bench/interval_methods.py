"""The rating's two intervals side by side on the same kept runs: the profile quasi-likelihood interval
(the default) and the bootstrap of the windows (what it replaced), recomputed from each run's own steps.

    python bench/interval_methods.py RUN_DIR... [--json bench/results/interval-methods.json]

RUN_DIR: folders of ``slobench capacity`` or ``slobench calibrate`` runs (``capacity_seeds_bench.py --keep``,
``calibration_bench.py --work``). Per run and method: the estimate (the same for both), ``ci_low`` /
``ci_high``, their width over the estimate, and for a calibrate run whether the interval holds the true
capacity; over the runs, how many of the other runs' ratings (``rate_rps``) and estimates each method's
intervals hold. Nothing is measured again: the steps are the runs' own.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

from loadgen.capacity import rating  # noqa: E402
from loadgen.results.runmeta import git_commit, now_iso  # noqa: E402

METHODS = ("profile", "bootstrap")


def one_run(run_dir: Path) -> dict | None:
    """Both intervals of one run; None for a run with no rating to put an interval on."""
    s = json.loads((run_dir / "summary.json").read_text())
    rc = s.get("rated_capacity") or {}
    if rc.get("rate_rps") is None:
        return None
    truth = (s.get("calibration") or {}).get("true_capacity_rps")
    seed = (rc.get("interval") or {}).get("seed") or 0
    out = {"run": run_dir.name, "rate_rps": rc["rate_rps"], "true_rps": truth}
    for m in METHODS:
        r = rating.rate(s["steps"], s.get("axis", "rate"), seed=seed, interval=m)
        if r is None:  # no step judged an SLO: the same for either method
            return None
        out[m] = {"estimate": r["estimate"], "ci": [r["ci_low"], r["ci_high"]], "stood": r["interval_method"],
                  "width": (r["ci_high"] - r["ci_low"]) / r["estimate"], "dispersion": r["dispersion"],
                  "holds_truth": None if truth is None else r["ci_low"] <= truth <= r["ci_high"]}
    return out


def held(runs: list[dict], method: str, key: str) -> list[int]:
    """Per run: how many of the other runs' ``key`` (rate_rps, or the method's estimate) its interval holds."""
    def value(r: dict) -> float:
        return r[method]["estimate"] if key == "estimate" else r[key]

    return [sum(r[method]["ci"][0] <= value(o) <= r[method]["ci"][1] for o in runs if o is not r) for r in runs]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="the profile and bootstrap intervals side by side on kept runs")
    ap.add_argument("runs", type=Path, nargs="+", help="capacity or calibrate run folders (with summary.json)")
    ap.add_argument("--json", type=Path, help="write the figures here")
    args = ap.parse_args(argv)
    missing = [str(d) for d in args.runs if not (d / "summary.json").exists()]
    if missing:
        print(f"error: no summary.json in {', '.join(missing)}", file=sys.stderr)
        return 2
    rated = {d: one_run(d) for d in args.runs}
    unrated = [str(d) for d, r in rated.items() if r is None]
    if unrated:
        print(f"left out (no rated capacity to put an interval on): {', '.join(unrated)}", file=sys.stderr)
    runs = [r for r in rated.values() if r is not None]
    if not runs:
        print("error: none of the runs has a rated capacity", file=sys.stderr)
        return 2
    result = {"bench": "interval-methods", "when": now_iso(), "git_commit": git_commit(), "runs": runs,
              "others": len(runs) - 1}
    for m in METHODS:
        result[m] = {"ratings_held": held(runs, m, "rate_rps"), "estimates_held": held(runs, m, "estimate"),
                     "widths": [r[m]["width"] for r in runs],
                     "truth_held": [r[m]["holds_truth"] for r in runs]}
    for r in runs:
        print(f"{r['run']}: rated {r['rate_rps']:.3g}, estimate {r['profile']['estimate']:.3g}"
              + (f", true {r['true_rps']:.3g}" if r["true_rps"] else "") + "; "
              + "; ".join(f"{m} {r[m]['ci'][0]:.3g}-{r[m]['ci'][1]:.3g}" for m in METHODS))
    for m in METHODS:
        print(f"{m}: intervals hold {sum(result[m]['ratings_held'])} of {len(runs) * (len(runs) - 1)} other ratings, "
              f"{sum(result[m]['estimates_held'])} other estimates"
              + (f"; the truth in {sum(bool(t) for t in result[m]['truth_held'])} of {len(runs)}"
                 if runs[0]["true_rps"] else ""))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
        print(f"written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
