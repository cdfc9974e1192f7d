"""Every step of kept capacity runs, as a table: what each asked for and offered, what decided it, and how its
failures came (one by one, or a run of refused requests in a burst).

    python bench/capacity_steps.py RUN_DIR [RUN_DIR ...] --json bench/results/capacity-steps.json

RUN_DIR: a ``slobench capacity`` run folder (``summary.json`` + ``requests.jsonl``), e.g. the ones
``bench/capacity_seeds_bench.py --keep DIR`` leaves. Per step and judged tier: the window's requests, how
many the target refused (HTTP 429: each counts as infinitely late in the SLO), how many were still in
flight when a step stopped at its breach (cut: they count with the time they had waited) or failed
otherwise, the p99 TTFT of the answered ones, and the most refusals within any ``--burst-s`` (0.5 s); per step
the breakdown's mean prefill and decode time (how fast the target ran at that load), and, where the
target exports it (the reference engine's ``slobench:admission_tail_factor``), its SLO admission's tail factor
per judged tier as scraped at the step's start, its window's start and its window's end: state the target
carries from one step into the next. Nothing is measured here: it reads what the runs wrote.
"""

from __future__ import annotations

import argparse
import bisect
import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

from loadgen.capacity.rating import step_load  # noqa: E402
from loadgen.capacity.step_stats import window_records  # noqa: E402
from loadgen.results import latency  # noqa: E402
from loadgen.results.rundir import METRICS, read_metrics, read_run_records  # noqa: E402

TAIL_FACTOR = "slobench:admission_tail_factor"


def most_within(times: list[float], span_s: float) -> int:
    """The most of ``times`` (sorted) inside any interval of length ``span_s``."""
    best, lo = 0, 0
    for hi, t in enumerate(times):
        while t - times[lo] > span_s:
            lo += 1
        best = max(best, hi - lo + 1)
    return best


def tail_factors(run_dir: Path) -> dict[str, tuple[list[float], list[float]]]:
    """Per tier, the scrape times and values of the target's admission tail factor (empty: not exported)."""
    out: dict[str, tuple[list[float], list[float]]] = {}
    for sample in read_metrics(run_dir / METRICS):
        for key, value in sample["metrics"].items():
            if key.startswith(TAIL_FACTOR + "{") and 'tier="' in key:
                tier = key.split('tier="', 1)[1].split('"', 1)[0]
                ts, vs = out.setdefault(tier, ([], []))
                ts.append(sample["t"])
                vs.append(value)
    return out


def value_at(series: tuple[list[float], list[float]] | None, t: float | None) -> float | None:
    """The last scraped value at or before ``t``."""
    if series is None or t is None:
        return None
    i = bisect.bisect_right(series[0], t) - 1
    return series[1][i] if i >= 0 else None


def step_rows(run_dir: Path, burst_s: float) -> list[dict]:
    summary = json.loads((run_dir / "summary.json").read_text())
    steps = summary.get("steps") or []
    windows = window_records(steps, read_run_records(run_dir))
    tails = tail_factors(run_dir)
    rows = []
    for st in steps:
        tiers = {}
        for tier, entry in (st.get("tiers") or {}).items():
            if not entry.get("judged"):
                continue
            recs = sorted((r for r in windows.get(st["index"], []) if (r.get("tier") or "none") == tier),
                          key=lambda r: r["scheduled_s"])
            refused = [r["scheduled_s"] for r in recs if r.get("status") == "rejected"]
            answered = [v for r in recs if latency.succeeded(r) and (v := latency.ttft_ms(r)) is not None]
            tiers[tier] = {"requests": len(recs), "refused": len(refused),
                           "cut_at_stop": sum(1 for r in recs if r.get("status") == "cancelled"),
                           "other_failed": sum(1 for r in recs if r.get("status") not in ("ok", "rejected",
                                                                                           "cancelled")),
                           "answered_p99_ttft_ms": latency.percentile(answered, 99) if answered else None,
                           f"most_refused_within_{burst_s:g}_s": most_within(refused, burst_s)}
            w = st.get("window_s") or [None, None]
            if tier in tails:
                tiers[tier]["tail_factor"] = {name: value_at(tails[tier], t) for name, t in
                                              (("start", st.get("start_s")), ("window", w[0]), ("end", w[1]))}
        rows.append({"index": st["index"], "phase": st.get("phase"), "draw": st.get("draw"),
                     "asked_rps": st.get("load"), "offered_rps": st.get("offered_rps"),
                     "placed_rps": step_load(st, summary.get("axis") or "rate"),
                     "duration_s": st.get("duration_s"), "passed": st.get("passed"), "early": st.get("early"),
                     "counted": st.get("counted"), "tiers": tiers,
                     # the engine's own speed at the step's load (its timing object), whatever the search did
                     "mean_prefill_ms": (st.get("breakdown") or {}).get("mean_prefill_ms"),
                     "mean_decode_ms": (st.get("breakdown") or {}).get("mean_decode_ms")})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", type=Path, help="capacity run folders")
    ap.add_argument("--burst-s", type=float, default=0.5, help="the span failures are counted within")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    missing = [str(r) for r in args.runs if not (r / "summary.json").is_file()]
    if missing:
        ap.error(f"no summary.json in {', '.join(missing)}")
    out = {"bench": "capacity_steps", "burst_s": args.burst_s,
           "runs": {r.name: step_rows(r, args.burst_s) for r in args.runs},
           "started_at": {r.name: json.loads((r / "summary.json").read_text()).get("started_at") for r in args.runs}}
    for run, rows in out["runs"].items():
        print(run)
        for row in rows:
            fails = {t: f"{e['refused']}/{e['requests']}" for t, e in row["tiers"].items()}
            tails = {t: "{start:.2f}>{end:.2f}".format(**e["tail_factor"]) for t, e in row["tiers"].items()
                     if e.get("tail_factor") and None not in e["tail_factor"].values()}
            print(f"  {row['index']:>2} {row['phase']:<8} asked {row['asked_rps']:6.1f} "
                  f"offered {row['offered_rps'] or 0:6.1f} {'pass' if row['passed'] else 'FAIL'} "
                  f"{row['early'] or '':<6} refused {fails}" + (f" tail factor {tails}" if tails else ""))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
