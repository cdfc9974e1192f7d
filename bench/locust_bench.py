"""How fast can one Locust worker process stream? (issue 6's measurement, beside the aiohttp replayer's)

The method of ``bench/replayer_bench.py``, unchanged: a ``slobench mock-server`` in its own process (on the
same cores: say so with the numbers), open-loop Poisson loads at increasing rates, each stream
``--tokens`` tokens ``--itl-ms`` apart, and per rate

- client lateness p50 / p99 (``sent_s - scheduled_s``),
- token delivery error p50 / p99 (``token_s[k] - (sent_s + ttft + k * itl)``, an upper bound on the
  client's: it includes the mock's own timer lateness),
- CPU time per streamed token (the sending processes' CPU time from the run's start to their last report,
  start-up excluded / tokens received; the replayer's is its run's CPU time).

A rate passes when p99 lateness <= 5 ms, p99 delivery error <= 5 ms and every request succeeded. The
Locust side runs ``locust -f loadgen/drivers/locust/locustfile.py --headless`` (one process: it is both the
runner and the only load generator, i.e. one worker's worth of sending; ``--processes N`` adds workers)
through ``loadgen.locust.driver.LocustProcess``, with the very schedule the replayer gets.

    .venv/bin/python bench/locust_bench.py --rates 100 200 300 400 --duration 8 --json bench/results/locust.json
    .venv/bin/python bench/locust_bench.py --drivers locust --rates 400 600 --processes 2
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]

from loadgen.drivers.locust.driver import LocustProcess  # noqa: E402
from loadgen.results.records import read_records  # noqa: E402
from loadgen.workload.arrivals import Arrivals  # noqa: E402
from loadgen.workload.synthetic import LengthDist, SyntheticWorkload  # noqa: E402


def _replayer_bench():
    spec = importlib.util.spec_from_file_location("replayer_bench", REPO / "bench" / "replayer_bench.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def analyse(recs: list[dict], planned: int, args, cpu: float) -> dict:
    ok = [r for r in recs if r["status"] == "ok"]
    late = np.array([r["sent_s"] - r["scheduled_s"] for r in recs if r["sent_s"] is not None]) * 1000
    ttft, itl = args.ttft_ms / 1000, args.itl_ms / 1000
    err = [np.asarray(r["token_s"]) - (r["sent_s"] + ttft + np.arange(len(r["token_s"])) * itl) for r in ok]
    err = np.concatenate(err) * 1000 if err else np.array([np.nan])
    tokens = sum(len(r["token_s"]) for r in ok)
    return {
        "requests": planned, "ok": len(ok),
        "lateness_p50_ms": float(np.percentile(late, 50)) if late.size else None,
        "lateness_p99_ms": float(np.percentile(late, 99)) if late.size else None,
        "delivery_p50_ms": float(np.percentile(err, 50)), "delivery_p99_ms": float(np.percentile(err, 99)),
        "tokens": tokens, "cpu_s": cpu, "cpu_us_per_token": cpu / max(tokens, 1) * 1e6,
    }


def locust_rate(url: str, rate: float, args, out_dir: Path) -> dict:
    times = Arrivals("poisson", rate=rate).times(duration_s=args.duration, seed=int(rate))
    specs = SyntheticWorkload(input_len=LengthDist("fixed", value=args.prompt_tokens),
                              output_len=LengthDist("fixed", value=args.tokens)).generate(times, seed=1)
    run = out_dir / f"locust{rate:g}"
    lp = LocustProcess(specs, url, run, model="mock", processes=args.processes)
    rc = lp.start().wait(timeout_s=args.duration + 120)
    # CPU time of the sending process(es) from the run's start to their last report (start-up excluded)
    cpu_by = json.loads((run / "locust_stages.json").read_text())["totals"]["cpu_s_by_process"]
    r = analyse(read_records(run / "requests.jsonl"), len(specs), args, sum(cpu_by))
    r["exit_code"] = rc
    r["cpu_s_by_process"] = cpu_by
    return r


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rates", type=float, nargs="+", default=[100, 200, 300, 400])
    ap.add_argument("--drivers", nargs="+", default=["locust", "aiohttp"], choices=("locust", "aiohttp"))
    ap.add_argument("--duration", type=float, default=8.0, help="seconds of arrivals per rate")
    ap.add_argument("--tokens", type=int, default=50)
    ap.add_argument("--itl-ms", type=float, default=20.0)
    ap.add_argument("--ttft-ms", type=float, default=20.0)
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--processes", type=int, default=1, help="Locust worker processes (1: one local process)")
    ap.add_argument("--workers", type=int, default=1, help="(for the aiohttp replayer: its processes)")
    ap.add_argument("--target", help="an already running mock server (default: start one)")
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args()

    rb = _replayer_bench()
    url, mock = rb.start_mock(args)
    results: dict[str, list[dict]] = {d: [] for d in args.drivers}
    try:
        with tempfile.TemporaryDirectory() as d:
            for rate in args.rates:
                for driver in args.drivers:
                    if driver == "locust":
                        r = locust_rate(url, rate, args, Path(d))
                    else:
                        r = rb.one_rate(url, rate, args, Path(d))
                    r["rate"] = rate
                    r["pass"] = (r["lateness_p99_ms"] is not None and r["lateness_p99_ms"] <= 5
                                 and r["delivery_p99_ms"] <= 5 and r["ok"] == r["requests"])
                    results[driver].append(r)
                    print(f"{driver:7s} rate {rate:6.0f} req/s  ok {r['ok']}/{r['requests']}  lateness p50/p99 "
                          f"{r['lateness_p50_ms']:.2f}/{r['lateness_p99_ms']:.2f} ms  delivery error p50/p99 "
                          f"{r['delivery_p50_ms']:.2f}/{r['delivery_p99_ms']:.2f} ms  CPU "
                          f"{r['cpu_us_per_token']:.1f} us/token  {'PASS' if r['pass'] else 'fail'}", flush=True)
                    time.sleep(1.0)
    finally:
        if mock:
            mock.terminate()
            mock.wait(10)
    best = {drv: max((r["rate"] for r in rs if r["pass"]), default=None) for drv, rs in results.items()}
    print(f"highest passing rate: {best} req/s (locust: {args.processes} process(es); {args.tokens} tokens/stream "
          f"{args.itl_ms:g} ms apart; mock server in its own process on the same cores)")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "results": results,
                                         "best_rate": best, "cpus": __import__("os").cpu_count()}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
