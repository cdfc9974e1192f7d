"""How sharp a scenario's knee is on this machine, and how precise its capacity search can be there.

    python bench/knee_windows.py [--scenario loadgen/scenarios/chat.yaml] [--loads 42 45 48 51 54 57] [--windows 5]
                                 [--durations bench/results/capacity-steps-idle-forget.json]
                                 [--sims 2000] [--out bench/results/knee-windows.json]

1. **Measure.** One embedded engine; every load ``--windows`` times, each window whole (no early stop), each
   on its own arrival draw, with the search's own step machinery (warm-up, window, judgement). The loads go
   in a shuffled order each round, so that the machine's drift falls on all of them alike.
2. **The knee.** Per load: how many windows passed, the binding SLO's exceedances. P(a window fails) as a
   function of load: the loads' failing shares made monotone (isotonic) and interpolated linearly in
   log(load), flat beyond the loads measured; beside it the logistic fit in log(load)
   (``capacity.crossing.logistic_fit``), which does not exist where the windows separate (every load below
   one passes, every load above it fails): the knee is then sharper than the loads' spacing.
3. **All windows pooled** through ``capacity.rating.rate``: the estimate and interval that this much
   measuring gives.
4. **The search on this knee, simulated.** ``CapacitySearch`` with the scenario's settings, each step
   passing with the interpolated probability at its load, independently of the steps before; its offered
   rate a Poisson draw over the sweep's median window; each step's duration drawn from the ``--durations``
   file's steps of its kind (a ``bench/capacity_steps.py`` file of real runs: ramp or not, passed or not,
   stopped early or not), the scenario's time budget applied as ``capacity.run`` applies it. Over
   ``--sims`` runs: the rating's spread (sd / median), the spread of three runs ((max - min) / median) and
   how often it is at most 5 %; the same for the load the search asked for at its pass end
   (``requested_*``: the rating without the Poisson noise of the windows' offered rates). What the model
   leaves out: a window whose draw offered more is likelier to fail (here they are independent), and the
   machine's drift between runs.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]

from sweep import measure_fixed  # noqa: E402 (this script's own folder)

from loadgen.capacity import rating  # noqa: E402
from loadgen.capacity.crossing import isotonic, logistic_fit  # noqa: E402
from loadgen.capacity.plan import CapacityPlan  # noqa: E402
from loadgen.capacity.run import over_budget, rated_capacity  # noqa: E402
from loadgen.capacity.search import CapacitySearch, SearchOutcome, StepResult  # noqa: E402
from loadgen.results.runmeta import git_commit, machine, now_iso, versions  # noqa: E402
from loadgen.scenario.parse import load_scenario  # noqa: E402
from loadgen.target.embedded import EmbeddedEngine  # noqa: E402


class Progress:
    """What ``measure_fixed`` shows (the runner's ``start_step`` and ``update``, its ``end_step``): one line
    per window."""

    def __init__(self, total: int):
        self.total, self.done, self.t0 = total, 0, time.monotonic()

    def start_step(self, *_a) -> None:
        pass

    def update(self, *_a) -> None:
        pass

    def end_step(self, d: dict) -> None:
        self.done += 1
        print(f"  window {self.done}/{self.total}: {d['load']:.1f} req/s asked, {d.get('offered_rps') or 0:.1f} "
              f"offered, {'pass' if d['passed'] else 'FAIL'}  ({time.monotonic() - self.t0:.0f} s)", flush=True)


def measure(scn, loads: list[float], windows: int, seed: int, work: Path) -> tuple[list[dict], float]:
    """The windows' step details, and the engine's start-up time (the simulated runs start after it)."""
    rng = np.random.default_rng(seed)
    order = [float(x) for _ in range(windows) for x in rng.permutation(loads)]
    engine = EmbeddedEngine(scn.engine_options(), log_path=work / "engine.log")
    t0 = time.monotonic()
    url = engine.start()
    start_s = time.monotonic() - t0
    try:
        return measure_fixed(scn, order, work / "sweep", target=url, early_stop=False,
                             display=Progress(len(order)), fresh_draws=True), start_s
    finally:
        engine.stop()


def binding_row(d: dict, tier: str, metric: str) -> dict:
    j = ((d.get("tiers") or {}).get(tier) or {}).get("judged", {}).get(metric) or {}
    w = d.get("window_s") or [0.0, 0.0]
    return {"load": d["load"], "planned_rps": d.get("planned_rps"), "offered_rps": d.get("offered_rps"),
            "window_s": w[1] - w[0], "passed": bool(d["passed"]), "over": j.get("over"), "n": j.get("n"),
            "runs": j.get("runs")}


def knee(rows: list[dict]) -> dict:
    x = np.array([r["load"] for r in rows])
    fails = np.array([0.0 if r["passed"] else 1.0 for r in rows])
    loads = sorted(set(x.tolist()))
    counts = np.array([(x == load).sum() for load in loads], dtype=float)
    share = isotonic(np.array([fails[x == load].mean() for load in loads]), counts)  # failing, monotone
    out = {"per_load": {f"{load:g}": {"windows": int(n), "passed": int(((x == load) & (fails == 0)).sum()),
                                      "failing_share_monotone": float(f)}
                        for load, n, f in zip(loads, counts, share, strict=True)},
           "interpolated": {"loads": loads, "failing_share": share.tolist()}}
    fit = logistic_fit(x, fails, np.ones_like(x))
    if fit is None or not fit[1] > 0:
        out["logistic"] = None  # the windows separate: no finite slope
        return out
    a, b = fit
    out["logistic"] = {"a": a, "b": b, "half_pass_load": math.exp(-a / b),
                       "width_20_80": math.exp((math.log(4.0) - math.log(0.25)) / b)}  # 80 % / 20 % failing
    return out


def failing_probability(model: dict, load: float) -> float:
    """The interpolated share of windows failing at ``load`` (flat beyond the loads measured)."""
    return float(np.interp(math.log(load), np.log(model["loads"]), model["failing_share"]))


def step_kinds(path: Path) -> dict[str, list[tuple[float, bool]]]:
    """The kept runs' step durations by kind, each with whether it ran to its cap."""
    data = json.loads(path.read_text())
    kinds: dict[str, list[tuple[float, bool]]] = {}
    for rows in data["runs"].values():
        for r in rows:
            if r.get("duration_s") is None or r.get("counted") is False:
                continue
            key = f"{'ramp' if r['phase'] == 'ramp' else 'search'}-{'pass' if r['passed'] else 'fail'}"
            kinds.setdefault(key, []).append((float(r["duration_s"]), not r.get("early")))
    return kinds


def simulated_searches(plan: CapacityPlan, start_s: float, sims: int, seed: int,
                       draw_step: Callable[[np.random.Generator, float, str], tuple[bool, dict, float, bool]],
                       ) -> list[tuple[SearchOutcome, float]]:
    """``sims`` searches with the plan's settings, each (outcome, wall time): ``draw_step(rng, load, phase)``
    draws a step (passed, its detail, its duration, whether it ran to its cap), the time budget applied as
    ``capacity.run`` applies it, the clock starting at ``start_s`` (the engine's start-up)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(sims):
        search, elapsed, full = CapacitySearch(plan.search), start_s, []
        while (nxt := search.next_step()) is not None:
            if why := over_budget(plan, elapsed, full):
                search.end(why)
                break
            load, phase = nxt
            passed, detail, dur, whole = draw_step(rng, load, phase)
            elapsed += dur
            if whole:
                full.append(dur)
            search.record(load, StepResult(passed, detail=detail))
        out.append((search.outcome(), elapsed))
    return out


def duration(rng: np.random.Generator, kinds: dict, phase: str, passed: bool,
             default_s: float) -> tuple[float, bool]:
    """A real step's duration of the kind (ramp or not, passed or not), and whether it ran to its cap."""
    pool = kinds.get(f"{'ramp' if phase == 'ramp' else 'search'}-{'pass' if passed else 'fail'}") or \
        [(default_s, True)]
    return pool[rng.integers(len(pool))]


def simulate(plan: CapacityPlan, model: dict, kinds: dict, window_s: float, start_s: float, sims: int,
             seed: int) -> dict:
    def draw_step(rng, load, phase):
        passed = bool(rng.random() >= failing_probability(model, load))
        dur, whole = duration(rng, kinds, phase, passed, plan.step.step_duration_s)
        offered = rng.poisson(load * window_s) / window_s
        return passed, {"offered_rps": offered, "window_s": [0.0, window_s]}, dur, whole

    ratings, requested, walls, ended, steps = [], [], [], 0, []
    for out, wall in simulated_searches(plan, start_s, sims, seed, draw_step):
        ended += out.ended_by is not None
        rc = rated_capacity(out, plan)
        if rc is not None and out.verdict == "rated":
            ratings.append(rc["rate_rps"])
            requested.append(out.rated_load)
        walls.append(wall)
        steps.append(len(out.steps))
    return {"sims": sims, "rated": len(ratings), **spread_figures(ratings, "rating"),
            **spread_figures(requested, "requested"),
            "wall_s_median": float(np.median(walls)), "wall_s_max": float(np.max(walls)),
            "ended_by_budget": ended / sims, "steps_median": float(np.median(steps))}


def spread_figures(values: list[float], name: str) -> dict:
    """Median, relative sd, and the spread of consecutive triples ((max - min) / median) of ``values``."""
    r = np.array(values)
    triples = r[: len(r) // 3 * 3].reshape(-1, 3)
    spread3 = (triples.max(1) - triples.min(1)) / np.median(triples, 1)
    return {f"{name}_median": float(np.median(r)), f"{name}_sd_rel": float(r.std() / np.median(r)),
            f"{name}_three_run_spread_median": float(np.median(spread3)),
            f"{name}_three_runs_within_5_percent": float((spread3 <= 0.05).mean())}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", default=str(REPO / "loadgen" / "scenarios" / "chat.yaml"))
    ap.add_argument("--loads", type=float, nargs="+", default=[42, 45, 48, 51, 54, 57])
    ap.add_argument("--windows", type=int, default=5, help="windows per load")
    ap.add_argument("--durations", type=Path, default=REPO / "bench" / "results" / "capacity-steps-idle-forget.json",
                    help="a bench/capacity_steps.py results file: the step durations of real runs")
    ap.add_argument("--sims", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--from", dest="from_file", type=Path,
                    help="re-analyse this results file, measure nothing (its `measured` commit and time are kept)")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "knee-windows.json")
    args = ap.parse_args()
    if not args.durations.is_file():
        ap.error(f"--durations {args.durations}: no such file")
    scn = load_scenario(args.scenario)
    plan = CapacityPlan.from_scenario(scn)
    if args.from_file:
        prev = json.loads(args.from_file.read_text())
        details, engine_start_s = prev["steps"], prev["engine_start_s"]
        measured = prev.get("measured") or {"git_commit": prev.get("git_commit"), "when": prev.get("when")}
    else:
        print(f"measuring {len(args.loads)} loads x {args.windows} windows of {args.scenario} ...", flush=True)
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.monotonic()
            details, engine_start_s = measure(scn, args.loads, args.windows, args.seed, Path(tmp))
            print(f"measured in {time.monotonic() - t0:.0f} s", flush=True)
        measured = {"git_commit": git_commit(), "when": now_iso()}
        # the measurements first: an analysis that fails can be redone with --from
        args.out.write_text(json.dumps({"bench": "knee_windows", "measured": measured,
                                        "engine_start_s": engine_start_s, "steps": details}, default=str) + "\n")
    pooled = rating.rate(details, plan.search.axis, confidence=plan.step.confidence, seed=scn.seed)
    if pooled is None:
        print("no window judged an SLO: nothing to analyse", file=sys.stderr)
        return 1
    tier, metric = pooled["binding"]["tier"], pooled["binding"]["metric"]
    rows = [binding_row(d, tier, metric) for d in details]
    k = knee(rows)
    window_s = float(np.median([r["window_s"] for r in rows]))
    sim = simulate(plan, k["interpolated"], step_kinds(args.durations), window_s, engine_start_s, args.sims,
                   args.seed)
    out = {"bench": "knee_windows", "when": now_iso(), "git_commit": git_commit(), "measured": measured,
           "machine": machine(),
           "versions": versions(), "scenario": args.scenario, "loads": args.loads, "windows": args.windows,
           "durations_from": str(args.durations), "engine_start_s": engine_start_s, "window_s_median": window_s,
           "binding": {"tier": tier, "metric": metric}, "rows": rows, "knee": k,
           "pooled": {key: pooled.get(key) for key in ("estimate", "ci_low", "ci_high", "boundary", "method")},
           "simulated_search": sim, "steps": details}
    args.out.write_text(json.dumps(out, indent=1, default=str) + "\n")
    print(json.dumps({key: out[key] for key in ("knee", "pooled", "simulated_search")}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
