"""`slobench capacity` on the embedded engine, as a user runs it, once per seed: the rated capacity, its
confidence interval, and the wall time of each run.

    python bench/capacity_seeds_bench.py [--scenario loadgen/scenarios/chat.yaml] [--seeds 1 2 3]
                                         [--out bench/results/capacity-seeds.json] [--set KEY=VALUE ...]

Each seed is one ``slobench capacity SCENARIO --seed S`` subprocess (its own embedded engine, default settings
unless ``--set`` overrides some). Written: per seed the verdict, ``rated_capacity`` (offered ``rate_rps``,
``requested_rps``, the interval ``ci_low`` / ``ci_high``, ``boundary``, ``binding``), steps, the run's own
duration and the wall time of the command (engine start-up included); overall the spread of the ratings ((max -
min) / median) and whether each rating lies inside every other run's interval, and how many of the other
runs' ratings (and estimates) each run's interval holds; the spread of the estimates beside the ratings'.
Goals from the issue: spread <= 5%, each within its neighbours' intervals, wall time <= 4 minutes.

``--probe`` measures the machine's speed just before and after each run, in a fresh process, and writes it
beside the run (``probe_before`` / ``probe_after``): the median step time of the embedded engine's ``tiny``
model decoding 32 sequences (``decode_step_ms``) and the median time of a fixed pure-Python loop
(``python_loop_ms``, what the HTTP server and the load generator spend their time in). ``probe_spread``
is their spread over the runs ((max - min) / median of each run's before/after mean), to read beside the
ratings' spread: a machine whose speed moves by 10 % between runs moves a rating at a throughput cliff too.

``--pin ENGINE_CPU CLIENT_CPU`` runs the load generator (and its scraper) on one core and the embedded
engine's server (both its processes, every thread) on another: ``taskset -c CLIENT_CPU`` for the command,
and the engine's threads moved onto ENGINE_CPU as soon as they exist (checked every 0.2 s while the run
lasts). Unpinned, the two share both cores as the OS schedules them, run by run.

``--summarize FILE`` recomputes those overall figures of a results file from the runs it holds (nothing is
measured again) and writes them back.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

from loadgen.results.runmeta import git_commit, machine, now_iso, versions  # noqa: E402

# A fresh process: the engine's decode step at batch 32, and a fixed pure-Python loop, as medians (ms).
PROBE = """
import json, statistics, time
from engine import Engine
from engine.experiments.drive import config, decode_rate
engine = Engine(config(model="tiny", max_num_seqs=32, kv_cache_tokens=32768))
decode = [decode_rate(engine, 32, steps=50)["median_step_ms"] for _ in range(3)]
def loop():
    t = time.perf_counter()
    d = {}
    for i in range(200_000):
        d[i % 1000] = d.get(i % 1000, 0) + i
    return (time.perf_counter() - t) * 1e3
py = [loop() for _ in range(7)]
print(json.dumps({"decode_step_ms": statistics.median(decode), "python_loop_ms": statistics.median(py)}))
"""


def probe() -> dict:
    r = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, capture_output=True, text=True)
    if r.returncode != 0:
        return {"error_text": r.stderr[-2000:]}
    return json.loads(r.stdout.strip().splitlines()[-1])


ENGINE_MODULES = ("engine.server", "engine.server.engine_core")  # the embedded server's two processes (`-m MODULE`)


def pin_engine(parent: subprocess.Popen, cpu: int) -> None:
    """Until ``parent`` ends: every thread of its descendants that run the engine's server (its front end
    and its engine core) onto ``cpu``. psutil comes with locust."""
    import psutil

    while parent.poll() is None:
        try:
            for proc in psutil.Process(parent.pid).children(recursive=True):
                if any(module in proc.cmdline() for module in ENGINE_MODULES):
                    for thread in proc.threads():
                        os.sched_setaffinity(thread.id, {cpu})
        except (psutil.Error, OSError):
            pass  # a process or thread that ended between the listing and the call
        time.sleep(0.2)


def run_seed(scenario: Path, seed: int, work: Path, index: int, sets: list[str],
             pin: tuple[int, int] | None = None) -> dict:
    out = work / f"run-{index}-seed-{seed}"
    t0 = time.monotonic()
    cmd = [sys.executable, "-m", "loadgen.cli", "capacity", str(scenario), "--seed", str(seed),
           "--out", str(out), "--no-progress", "--no-report", *(a for kv in sets for a in ("--set", kv))]
    proc = subprocess.Popen((["taskset", "-c", str(pin[1])] if pin else []) + cmd, cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    watcher = threading.Thread(target=pin_engine, args=(proc, pin[0]), daemon=True) if pin else None
    if watcher:
        watcher.start()
    _stdout, stderr = proc.communicate()
    wall = time.monotonic() - t0
    if not (out / "summary.json").exists():
        return {"seed": seed, "returncode": proc.returncode, "wall_s": round(wall, 1), "error_text": stderr[-2000:]}
    s = json.loads((out / "summary.json").read_text())
    rc = s.get("rated_capacity") or {}
    keep = ("rate_rps", "requested_rps", "window_s", "estimate", "ci_low", "ci_high", "boundary", "binding",
            "confirmed")
    return {"seed": seed, "returncode": proc.returncode, "verdict": s.get("verdict"), "valid": s.get("valid"),
            "rated_capacity": {k: rc.get(k) for k in keep}, "steps": len(s.get("steps") or []),
            "phases": [st.get("phase") for st in s.get("steps") or []],
            "run_duration_s": s.get("duration_s"), "wall_s": round(wall, 1), "run_dir": str(out)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenario", type=Path, default=REPO / "loadgen" / "scenarios" / "chat.yaml")
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3],
                    help="one run per entry; a seed given twice is run twice (machine noise beside the draw's)")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "capacity-seeds.json")
    ap.add_argument("--keep", type=Path, help="keep the run folders here (default: a temporary folder)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a scenario override for every run, as `slobench capacity --set` (e.g. "
                         "search.refine_steps=10); the goals are for the defaults")
    ap.add_argument("--probe", action="store_true",
                    help="measure the machine's speed (engine decode step, a Python loop) before and after each run")
    ap.add_argument("--pin", type=int, nargs=2, metavar=("ENGINE_CPU", "CLIENT_CPU"),
                    help="the embedded engine on one core, the load generator on another (see above)")
    ap.add_argument("--alternate", action="store_true",
                    help="with --pin: every seed twice in a row, pinned then not, so that both see the same "
                         "machine (each run says whether it was pinned)")
    ap.add_argument("--summarize", type=Path, metavar="FILE",
                    help="recompute the overall figures of this results file from its runs, measure nothing")
    args = ap.parse_args()
    if args.summarize:
        return summarize(args.summarize)
    if args.alternate and not args.pin:
        ap.error("--alternate alternates pinned and unpinned runs: it needs --pin")
    if args.pin and not shutil.which("taskset"):
        ap.error("--pin needs taskset (util-linux)")
    if args.pin and not set(args.pin) <= os.sched_getaffinity(0):
        ap.error(f"--pin {args.pin[0]} {args.pin[1]}: this process may run on CPUs {sorted(os.sched_getaffinity(0))}")
    work = args.keep or Path(tempfile.mkdtemp(prefix="capacity-seeds-"))
    work.mkdir(parents=True, exist_ok=True)
    runs = []
    plan = [(seed, pin) for seed in args.seeds
            for pin in ([tuple(args.pin), None] if args.alternate else [args.pin and tuple(args.pin)])]
    for index, (seed, pin) in enumerate(plan):
        print(f"seed {seed}{' pinned' if pin else ''}: slobench capacity {args.scenario} ...", flush=True)
        before = probe() if args.probe else None
        runs.append(run_seed(args.scenario, seed, work, index, args.set, pin))
        runs[-1]["pinned"] = list(pin) if pin else None
        if args.probe:
            runs[-1].update(probe_before=before, probe_after=probe())
        print("  " + json.dumps(runs[-1]), flush=True)
    result = {
        "bench": "capacity_seeds_bench", "when": now_iso(), "git_commit": git_commit(), "machine": machine(),
        "versions": versions(), "scenario": str(args.scenario.relative_to(REPO) if args.scenario.is_absolute()
                                                 and REPO in args.scenario.parents else args.scenario),
        "set": args.set,
        "runs": runs, **figures(runs),
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("spread", "inside_others_intervals", "max_wall_s", "probe_spread")}))
    return 0


def figures(runs: list[dict]) -> dict:
    """The overall figures of a set of runs (see the module's docstring)."""
    rcs = [r.get("rated_capacity") or {} for r in runs]
    unique = len({r["seed"] for r in runs}) == len(runs)
    names = [str(r["seed"]) if unique else f"run {i} (seed {r['seed']})" for i, r in enumerate(runs)]

    def spread(key: str) -> float | None:
        v = [rc[key] for rc in rcs if rc.get(key)]
        return (max(v) - min(v)) / statistics.median(v) if len(v) >= 2 else None

    def held(key: str) -> dict[str, int]:  # per run: the other runs' values its interval holds
        return {names[i]: sum(1 for j, o in enumerate(rcs) if j != i and o.get(key) is not None
                              and rc["ci_low"] <= o[key] <= rc["ci_high"])
                for i, rc in enumerate(rcs) if rc.get("ci_low") is not None}

    inside = {}
    for i, rc in enumerate(rcs):
        others = [o for j, o in enumerate(rcs) if j != i and o.get("ci_low") is not None]
        if rc.get("rate_rps") is not None and others:
            inside[names[i]] = all(o["ci_low"] <= rc["rate_rps"] <= o["ci_high"] for o in others)
    ratings, estimates = held("rate_rps"), held("estimate")
    pairs = sum(1 for rc in rcs if rc.get("ci_low") is not None) * (len(runs) - 1)
    return {"spread": spread("rate_rps"), "estimate_spread": spread("estimate"), "inside_others_intervals": inside,
            "others_ratings_held": ratings, "others_ratings_held_total": f"{sum(ratings.values())} of {pairs}",
            "others_estimates_held": estimates, "others_estimates_held_total": f"{sum(estimates.values())} of {pairs}",
            "max_wall_s": max(r["wall_s"] for r in runs), "probe_spread": probe_spread(runs)}


def probe_spread(runs: list[dict]) -> dict | None:
    """Per probe figure, the spread over the runs of each run's mean of its before and after probes."""
    out = {}
    for key in ("decode_step_ms", "python_loop_ms"):
        v = [statistics.mean([r["probe_before"][key], r["probe_after"][key]]) for r in runs
             if key in (r.get("probe_before") or {}) and key in (r.get("probe_after") or {})]
        if len(v) >= 2:
            out[key] = (max(v) - min(v)) / statistics.median(v)
    return out or None


def summarize(path: Path) -> int:
    result = json.loads(path.read_text())
    result.update(figures(result["runs"]))
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k not in ("runs", "machine", "versions")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
