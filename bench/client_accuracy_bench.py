"""How accurately does slobench measure a target whose timing is exact? (the strict-servers issue)

Starts ``slobench mock-server`` (its own process, on the same cores as the client: say so when you report
numbers) with an exact first-token delay and inter-token gap, and runs fixed loads through the same path
``slobench run`` takes (``fixed_load.execute``: the driver, its connection warm-up, the scraper). The
mock's TTFT is exact, so every millisecond above ``--ttft-ms`` is the client's (or the machine's) error.

- ``--mode streaming``: constant arrivals at each of ``--rates``; p50 / p99 TTFT against the exact
  value, client lateness p99, CPU per streamed token. Goal: p99 TTFT <= ttft + 5 ms up to 800 req/s.
- ``--mode scrape``: at one rate, against a mock whose ``/metrics`` page is ``--metrics-bytes`` long,
  runs with the 1 s scrape and with ``--no-scrape``, alternated ``--repeats`` times, side by side.
  Goal: p99 lateness < 2 ms and p99 TTFT within 1 ms of the unscraped runs.

    .venv/bin/python bench/client_accuracy_bench.py --mode streaming --rates 200 400 600 800 \\
        --json bench/results/streaming-accuracy.json
    .venv/bin/python bench/client_accuracy_bench.py --mode scrape --rates 200 --metrics-bytes 1000000 \\
        --json bench/results/scrape-disturbance.json
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

from loadgen.drivers.http_request import ClientConfig  # noqa: E402
from loadgen.fixed_load import RunOptions, execute  # noqa: E402
from loadgen.results import latency  # noqa: E402
from loadgen.results.records import read_records  # noqa: E402
from loadgen.target.embedded import free_port, wait_healthy  # noqa: E402
from loadgen.workload.arrivals import Arrivals  # noqa: E402
from loadgen.workload.synthetic import LengthDist, SyntheticWorkload  # noqa: E402


def start_mock(args) -> tuple[str, subprocess.Popen]:
    port = free_port()
    cmd = [sys.executable, "-m", "loadgen.cli", "mock-server", "--port", str(port), "--ttft-ms", str(args.ttft_ms),
           "--itl-ms", str(args.itl_ms), "--tokens", str(args.tokens)]
    if args.metrics_bytes:
        cmd += ["--metrics-bytes", str(args.metrics_bytes)]
    mock = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url, mock, 30)
    return url, mock


def one_run(url: str, rate: float, args, out: Path, scrape: bool) -> dict:
    times = Arrivals("constant", rate=rate).times(duration_s=args.duration, seed=1)
    specs = SyntheticWorkload(input_len=LengthDist("fixed", value=args.prompt_tokens),
                              output_len=LengthDist("fixed", value=args.tokens)).generate(times, seed=1)
    before = resource.getrusage(resource.RUSAGE_SELF)
    res = execute(specs, RunOptions(run_dir=out, client=ClientConfig(url, model="mock"), scrape=scrape,
                                    progress=False))
    after = resource.getrusage(resource.RUSAGE_SELF)
    recs = read_records(out / "requests.jsonl")
    ok = [r for r in recs if latency.succeeded(r)]
    ttft = [latency.ttft_ms(r) for r in ok]
    late = [latency.lateness_ms(r) for r in recs if latency.lateness_ms(r) is not None]
    tokens = sum(len(r["token_s"]) for r in ok)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    s = res.summary
    return {"rate": rate, "scrape": scrape, "requests": len(specs), "ok": len(ok),
            "ttft_p50_ms": latency.percentile(ttft, 50), "ttft_p99_ms": latency.percentile(ttft, 99),
            "ttft_max_ms": max(ttft) if ttft else None,
            "lateness_p50_ms": latency.percentile(late, 50), "lateness_p99_ms": latency.percentile(late, 99),
            "cpu_us_per_token": cpu / max(tokens, 1) * 1e6, "scrape_cost": s.get("scrape"),
            "slow_in_first_second": sum(1 for r in ok if r["scheduled_s"] < min(x["scheduled_s"] for x in ok) + 1
                                        and latency.ttft_ms(r) > args.ttft_ms + 6)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=("streaming", "scrape"), default="streaming")
    ap.add_argument("--rates", type=float, nargs="+", default=[200, 400, 600, 800])
    ap.add_argument("--duration", type=float, default=8.0, help="seconds of arrivals per run")
    ap.add_argument("--tokens", type=int, default=50)
    ap.add_argument("--itl-ms", type=float, default=20.0)
    ap.add_argument("--ttft-ms", type=float, default=50.0)
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--metrics-bytes", type=int, default=0, help="pad the mock's /metrics page to this size")
    ap.add_argument("--repeats", type=int, default=3, help="scrape mode: runs with and without scraping, alternated")
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args()

    url, mock = start_mock(args)
    results = []
    try:
        with tempfile.TemporaryDirectory() as d:
            plan = ([(rate, False) for rate in args.rates] if args.mode == "streaming" else
                    [(args.rates[0], scrape) for _ in range(args.repeats) for scrape in (True, False)])
            for i, (rate, scrape) in enumerate(plan):
                r = one_run(url, rate, args, Path(d) / f"run{i}", scrape)
                results.append(r)
                print(f"rate {rate:5.0f} req/s  scrape {'on ' if scrape else 'off'}  ok {r['ok']}/{r['requests']}  "
                      f"TTFT p50/p99 {r['ttft_p50_ms']:.2f}/{r['ttft_p99_ms']:.2f} ms (exact {args.ttft_ms:g})  "
                      f"lateness p99 {r['lateness_p99_ms']:.2f} ms  CPU {r['cpu_us_per_token']:.1f} us/token",
                      flush=True)
                time.sleep(1.0)
    finally:
        mock.terminate()
        mock.wait(10)
    out = {"mode": args.mode, "args": {k: str(v) for k, v in vars(args).items()}, "results": results,
           "machine_note": "mock server and client on the same cores"}
    if args.mode == "scrape":
        def med(key: str, scrape: bool) -> float | None:
            return latency.percentile([r[key] for r in results if r["scrape"] is scrape], 50)
        out["median_of_runs"] = {f"{k}_{'scraped' if s else 'unscraped'}": med(k, s)
                                 for k in ("ttft_p99_ms", "lateness_p99_ms") for s in (True, False)}
        m = out["median_of_runs"]
        out["ttft_p99_difference_ms"] = m["ttft_p99_ms_scraped"] - m["ttft_p99_ms_unscraped"]
        print(f"medians over {args.repeats} runs each: p99 TTFT scraped {m['ttft_p99_ms_scraped']:.2f} ms vs "
              f"unscraped {m['ttft_p99_ms_unscraped']:.2f} ms (difference {out['ttft_p99_difference_ms']:+.2f} ms); "
              f"p99 lateness scraped {m['lateness_p99_ms_scraped']:.2f} ms")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
