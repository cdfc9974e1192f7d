"""How many requests the engine's SLO-aware admission refuses near chat.yaml's knee, and whether it had to.

Starts the embedded engine as chat.yaml runs it (tiny, 64 slots) and sends chat.yaml's workload (premium 1 :
standard 2, Poisson) at each of ``--rates`` for ``--duration`` s, one after the other with a pause between
(as a capacity run's steps). For each load and tier: requests, 429s, the answered requests' p99 TTFT, and the
share that met the tier's promise with every 429 counted as a miss (what a capacity step judges). Run it again
with ``--engine-opt admission=queue-length`` for the same loads without refusals: where that meets the
promises, the 429s were not needed. ``--bin-s B``: also each run's timeline in B-second bins of arrival time
(requests, standard misses: 429s and answers past 800 ms), to see whether misses come later in a long run.

    .venv/bin/python bench/admission_bench.py --json bench/results/admission.json
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

from loadgen.results import latency  # noqa: E402
from loadgen.results.records import read_records  # noqa: E402
from loadgen.results.runmeta import git_commit, machine, now_iso, versions  # noqa: E402
from loadgen.target.embedded import EmbeddedEngine  # noqa: E402

PROMISE_MS = {"premium": 300.0, "standard": 800.0}
SCENARIO = """name: admission
seed: {seed}
workload:
  type: synthetic
  input_len: {{dist: lognormal, mean: 96, sigma: 0.5, min: 16, max: 512}}
  output_len: {{dist: uniform, min: 16, max: 48}}
  shared_prefix: {{num_prompts: 4, length: 64, ratio: 0.5}}
tiers:
  premium: {{weight: 1, slo: {{ttft_ms: 300}}}}
  standard: {{weight: 2, slo: {{ttft_ms: 800}}}}
load: {{arrival: poisson, rate: {rate}, duration_s: {duration}}}
client: {{lateness_bound_ms: 50}}
"""


def timeline(records: list[dict], bin_s: float) -> list[dict]:
    """Per ``bin_s`` of arrival time: requests, and standard requests that missed (429 or past the promise)."""
    if not records:
        return []
    t0 = min(x["scheduled_s"] for x in records)
    bins: dict[int, dict] = {}
    for x in records:
        b = bins.setdefault(int((x["scheduled_s"] - t0) // bin_s), {"requests": 0, "standard_missed": 0})
        b["requests"] += 1
        ttft = latency.ttft_ms(x) if x["status"] == "ok" else None
        if x["tier"] == "standard" and (ttft is None or ttft > PROMISE_MS["standard"]):
            b["standard_missed"] += 1
    return [{"from_s": k * bin_s, **bins[k]} for k in sorted(bins)]


def load_run(url: str, rate: float, duration: float, seed: int, out: Path, bin_s: float | None = None) -> dict:
    scenario = out.with_suffix(".yaml")
    scenario.write_text(SCENARIO.format(rate=rate, duration=duration, seed=seed))
    r = subprocess.run([sys.executable, "-m", "loadgen.cli", "run", str(scenario), "--target", url, "--out", str(out),
                        "--no-progress", "--no-report", "--no-scrape", "--json"],
                       cwd=REPO, capture_output=True, text=True, timeout=duration + 600)
    records = read_records(out / "requests.jsonl")
    result: dict = {"rate_rps": rate, "duration_s": duration, "seed": seed, "exit_code": r.returncode,
                    "requests": len(records), "tiers": {}}
    for tier, promise in PROMISE_MS.items():
        rs = [x for x in records if x["tier"] == tier]
        ok = [x for x in rs if x["status"] == "ok"]
        ttft = [t for x in ok if (t := latency.ttft_ms(x)) is not None]  # an answer without a token: a miss
        met = sum(1 for t in ttft if t <= promise)
        result["tiers"][tier] = {
            "requests": len(rs), "refused_429": sum(1 for x in rs if x["status"] == "rejected"),
            "other_failed": sum(1 for x in rs if x["status"] not in ("ok", "rejected")),
            "answered_p99_ttft_ms": latency.percentile(ttft, 99),
            "met_share": met / len(rs) if rs else None}
    if bin_s:
        result["timeline"] = timeline(records, bin_s)
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rates", type=float, nargs="+", default=[48.0, 52.0, 56.0], help="loads in req/s")
    ap.add_argument("--duration", type=float, default=30.0, help="seconds of arrivals per load")
    ap.add_argument("--seeds", type=int, nargs="+", default=[1], help="one run per seed at every load")
    ap.add_argument("--pause", type=float, default=1.0, help="idle seconds between loads")
    ap.add_argument("--bin-s", type=float, help="also write each run's timeline in bins of this many seconds")
    ap.add_argument("--engine-opt", action="append", default=[], metavar="KEY=VALUE",
                    help="engine option, e.g. admission=queue-length")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    options = {"model": "tiny", "max_num_seqs": 64}
    for kv in args.engine_opt:
        key, _, value = kv.partition("=")
        options[key] = value
    out: dict = {"bench": "admission_bench", "when": now_iso(), "git_commit": git_commit(REPO),
                 "machine": machine(), "versions": versions(), "engine": options,
                 "promises_ms": PROMISE_MS, "runs": []}
    with tempfile.TemporaryDirectory() as tmp:
        engine = EmbeddedEngine(options, log_path=Path(tmp) / "engine.log")
        url = engine.start()
        try:
            for seed in args.seeds:
                for rate in args.rates:
                    run = load_run(url, rate, args.duration, seed, Path(tmp) / f"r{rate:g}-s{seed}", args.bin_s)
                    out["runs"].append(run)
                    cells = "  ".join(
                        f"{t}: 429 {v['refused_429']}/{v['requests']}, p99 {v['answered_p99_ttft_ms'] or 0:.0f} ms, "
                        f"met {100 * (v['met_share'] or 0):.1f} %" for t, v in run["tiers"].items())
                    print(f"{rate:5.1f} req/s seed {seed}: {cells}", flush=True)
                    if args.bin_s:
                        print("   misses per bin: " + " ".join(str(b["standard_missed"]) for b in run["timeline"]))
                    time.sleep(args.pause)
        finally:
            engine.stop()
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
