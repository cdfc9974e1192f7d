"""`slobench plan` against `slobench capacity` on the embedded engine: predicted vs measured rated capacity.

    python bench/plan_bench.py [--scenarios loadgen/scenarios/chat.yaml ...] [--out bench/results/plan.json]
                               [--plan-arg=--requests=2000 ...] [--capacity-set search.step_duration_s=8 ...]

For each scenario (default: chat.yaml, customer-service.yaml, long-prompt-burst.yaml):

1. the theory-only prediction: ``--hardware host`` (this CPU's matmul FLOPs and copy bandwidth, measured),
   the roofline step model, the simulation's rated capacity;
2. the calibration (``--calibrate embedded``: the scenario's engine started for it; timed, engine start-up
   apart): the probe, whose fit alone gives the ``probe`` prediction, then the two load points that scale it,
   the ``calibrated`` prediction (``probe_s`` is the whole calibration: probe and load points);
3. ``slobench capacity SCENARIO`` as a user runs it (a subprocess, its own engine);
4. steps 1 and 2 again: this machine's speed drifts by 10-25 % over minutes (the same engine's rating
   moved from 45 to 61 req/s between two runs of this bench), so the predictions bracket the measurement
   and each figure is the geometric mean of the one before and the one after (both kept, ``before`` /
   ``after``: their ratio is the drift);
5. the errors, predicted / measured - 1, of the theory-only, probe and calibrated predictions against the
   measured rated capacity (``rated_capacity.rate_rps``, the offered rate).

Goals from the issue: calibrated within 10 % of measured on all three, the probe under 90 s. Run it on an
otherwise idle machine.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

from loadgen.results.runmeta import git_commit, machine, now_iso, versions  # noqa: E402

SCENARIOS = ("chat.yaml", "customer-service.yaml", "long-prompt-burst.yaml")


def predict(scenario: Path, work: Path, extra: list[str], tag: str = "before") -> tuple[dict, float]:
    out = work / f"{scenario.stem}-plan-{tag}.json"
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-c", "import sys; from bench.plan_bench import plan_main; "
                        "sys.exit(plan_main(sys.argv[1:]))", str(scenario), "--hardware", "host", "--calibrate",
                        "embedded", "--json", str(out), "--plot", str(work / f"{scenario.stem}-plan-{tag}.html"),
                        *extra],
                       cwd=REPO, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"plan {scenario} failed ({r.returncode}): {r.stderr[-2000:]}")
    return json.loads(out.read_text()), time.monotonic() - t0


def plan_main(argv: list[str]) -> int:
    """``slobench plan`` through its own command function (whether or not cli.py lists it yet)."""
    from loadgen.commands.common import UsageError
    from loadgen.commands.plan import cmd_plan, register

    ap = argparse.ArgumentParser(prog="slobench")
    register(ap.add_subparsers(dest="cmd"))
    try:
        return cmd_plan(ap.parse_args(["plan", *argv]))
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def measure(scenario: Path, work: Path, sets: list[str]) -> tuple[dict, float]:
    out = work / f"{scenario.stem}-capacity"
    t0 = time.monotonic()
    cmd = [str(REPO / ".venv" / "bin" / "python"), "-m", "loadgen.cli", "capacity", str(scenario), "--out", str(out),
           "--no-progress", "--no-report", *[a for s in sets for a in ("--set", s)]]
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    wall = time.monotonic() - t0
    if not (out / "summary.json").exists():
        raise SystemExit(f"capacity {scenario} failed ({r.returncode}): {r.stderr[-2000:]}")
    return json.loads((out / "summary.json").read_text()), wall


def error(pred: float | None, meas: float | None) -> float | None:
    return pred / meas - 1 if pred is not None and meas else None


def geomean(a: float | None, b: float | None) -> float | None:
    return (a * b) ** 0.5 if a and b else None


def one(scenario: Path, work: Path, plan_args: list[str], sets: list[str]) -> dict:
    plan, plan_wall = predict(scenario, work, plan_args)
    summary, cap_wall = measure(scenario, work, sets)
    after, _ = predict(scenario, work, plan_args, tag="after")
    rc = summary.get("rated_capacity") or {}
    measured = rc.get("rate_rps")
    models = plan["models"]
    row = {"scenario": scenario.name, "measured_rps": measured, "measured_requested_rps": rc.get("requested_rps"),
           "verdict": summary.get("verdict"), "measured_is_lower_bound": summary.get("verdict") == "never_broke",
           "capacity_wall_s": round(cap_wall, 1),
           "probe_s": round(max(plan["calibration"]["wall_s"], after["calibration"]["wall_s"]), 1),
           "load_points": {"before": plan["calibration"].get("load_points"),
                           "after": after["calibration"].get("load_points")},
           "probe_fit_rel_rms": [plan["calibration"]["rel_rms"], after["calibration"]["rel_rms"]],
           # the calibration's model (the probe's fit scaled by the load points; the key predates them)
           "probe_step_model": {"before": plan["calibration"]["model"], "after": after["calibration"]["model"]},
           "probe_fit_step_model": {"before": plan["calibration"].get("probe_model"),
                                    "after": after["calibration"].get("probe_model")},
           "plan_wall_s": round(plan_wall, 1), "hardware": {"before": plan["hardware"], "after": after["hardware"]}}
    for name in [n for n in ("theory", "probe", "calibrated") if n in models and n in after["models"]]:
        m, m2 = models[name], after["models"][name]
        rated = geomean(m["rated_rps"], m2["rated_rps"])
        cf = geomean(m["closed_form"]["slo_rps"], m2["closed_form"]["slo_rps"])
        row[name] = {"rated_rps": rated, "before_rps": m["rated_rps"], "after_rps": m2["rated_rps"],
                     "closed_form_slo_rps": cf, "error": error(rated, measured),
                     "error_before": error(m["rated_rps"], measured), "error_after": error(m2["rated_rps"], measured),
                     "closed_form_error": error(cf, measured)}
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenarios", type=Path, nargs="+", default=[REPO / "loadgen" / "scenarios" / s
                                                                  for s in SCENARIOS])
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "plan.json")
    ap.add_argument("--plan-arg", action="append", default=[], help="passed to slobench plan (e.g. --requests=2000)")
    ap.add_argument("--capacity-set", action="append", default=[], help="passed to slobench capacity as --set")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="plan-bench-"))
    rows = []
    for scn in args.scenarios:
        print(f"{scn.name}: plan (theory, probe, calibrated), capacity, plan again ...", flush=True)
        rows.append(one(scn, work, args.plan_arg, args.capacity_set))
        print("  " + json.dumps({k: rows[-1].get(k) for k in ("measured_rps", "probe_s", "theory", "probe",
                                                             "calibrated")}),
              flush=True)
    cal = [abs(r["calibrated"]["error"]) for r in rows if r["calibrated"]["error"] is not None]
    result = {"bench": "plan", "when": now_iso(), "git_commit": git_commit(), "machine": machine(),
              "versions": versions(), "plan_args": args.plan_arg, "capacity_set": args.capacity_set,
              "work_dir": str(work), "runs": rows,
              "max_abs_calibrated_error": max(cal) if cal else None,
              "goal_calibrated_within_10pct": bool(cal) and len(cal) == len(rows) and max(cal) <= 0.10,
              "max_probe_s": max(r["probe_s"] for r in rows) if rows else None,
              "goal_probe_under_90s": bool(rows) and max(r["probe_s"] for r in rows) < 90}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"written {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
