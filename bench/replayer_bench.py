"""How fast can one replayer process go? (issue 4's measurement)

Starts ``slobench mock-server`` in its own process (it shares this machine's cores with the replayer:
say so when you report numbers), then runs open-loop Poisson loads at increasing rates, each stream
``--tokens`` tokens ``--itl-ms`` apart, and for each rate reports:

- client lateness p50 / p99: ``sent_s - scheduled_s``;
- token delivery error p50 / p99: ``token_s[k] - (sent_s + ttft + k * itl)``, i.e. how late the client
  saw each token compared with when the mock server was told to emit it (includes the mock's own
  timer lateness, so it is an upper bound on the client's);
- CPU time of the replayer per streamed token (process CPU time over the run / tokens received).

A rate passes when p99 lateness <= 5 ms and p99 delivery error <= 5 ms. The highest passing rate is
printed at the end.

    .venv/bin/python bench/replayer_bench.py --rates 200 400 600 800 --duration 8
    .venv/bin/python bench/replayer_bench.py --rates 800 1200 --workers 2
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

import numpy as np

from loadgen.drivers.event_loop import run_sync  # noqa: E402
from loadgen.drivers.http_request import ClientConfig  # noqa: E402
from loadgen.drivers.replayer import Replayer  # noqa: E402
from loadgen.fixed_load import RunOptions, execute  # noqa: E402
from loadgen.results.records import RecordWriter, read_records  # noqa: E402
from loadgen.target.embedded import free_port, wait_healthy  # noqa: E402
from loadgen.workload.arrivals import Arrivals  # noqa: E402
from loadgen.workload.synthetic import LengthDist, SyntheticWorkload  # noqa: E402


def one_rate(url: str, rate: float, args, out_dir: Path) -> dict:
    times = Arrivals("poisson", rate=rate).times(duration_s=args.duration, seed=int(rate))
    specs = SyntheticWorkload(input_len=LengthDist("fixed", value=args.prompt_tokens),
                              output_len=LengthDist("fixed", value=args.tokens)).generate(times, seed=1)
    path = out_dir / f"rate{rate:g}.jsonl"
    cfg = ClientConfig(url, model="mock")
    if args.workers == 1:
        async def go():
            with RecordWriter(path) as w:
                rep = Replayer(cfg, w)
                await rep.open()
                c0 = time.process_time()
                await rep.run(specs)
                cpu = time.process_time() - c0
                await rep.close()
                return cpu
        cpu = run_sync(go)
    else:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        execute(specs, RunOptions(run_dir=out_dir / f"rate{rate:g}", client=cfg, workers=args.workers,
                                  scrape=False, progress=False))
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
        path = out_dir / f"rate{rate:g}" / "requests.jsonl"
    recs = read_records(path)
    ok = [r for r in recs if r["status"] == "ok"]
    late = np.array([r["sent_s"] - r["scheduled_s"] for r in recs]) * 1000
    err = []
    ttft, itl = args.ttft_ms / 1000, args.itl_ms / 1000
    for r in ok:
        ts = np.asarray(r["token_s"])
        err.append(ts - (r["sent_s"] + ttft + np.arange(len(ts)) * itl))
    err = np.concatenate(err) * 1000 if err else np.array([np.nan])
    tokens = sum(len(r["token_s"]) for r in ok)
    return {
        "rate": rate, "requests": len(specs), "ok": len(ok),
        "achieved_rate": (len(recs) - 1) / (max(r["scheduled_s"] for r in recs) or 1),
        "lateness_p50_ms": float(np.percentile(late, 50)), "lateness_p99_ms": float(np.percentile(late, 99)),
        "delivery_p50_ms": float(np.percentile(err, 50)), "delivery_p99_ms": float(np.percentile(err, 99)),
        "tokens": tokens, "cpu_s": cpu, "cpu_us_per_token": cpu / max(tokens, 1) * 1e6,
    }


def start_mock(args) -> tuple[str, subprocess.Popen | None]:
    """``args.target``, or a fresh ``slobench mock-server`` with the bench's timing in its own process."""
    if args.target:
        return args.target, None
    port = free_port()
    mock = subprocess.Popen(
        [sys.executable, "-m", "loadgen.cli", "mock-server", "--port", str(port), "--ttft-ms", str(args.ttft_ms),
         "--itl-ms", str(args.itl_ms), "--tokens", str(args.tokens)],
        cwd=Path(__file__).resolve().parents[1], stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url, mock, 30)
    return url, mock


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rates", type=float, nargs="+", default=[200, 400, 600, 800])
    ap.add_argument("--duration", type=float, default=8.0, help="seconds of arrivals per rate")
    ap.add_argument("--tokens", type=int, default=50)
    ap.add_argument("--itl-ms", type=float, default=20.0)
    ap.add_argument("--ttft-ms", type=float, default=20.0)
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--target", help="an already running mock server (default: start one)")
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args()

    url, mock = start_mock(args)
    results = []
    try:
        with tempfile.TemporaryDirectory() as d:
            for rate in args.rates:
                r = one_rate(url, rate, args, Path(d))
                r["pass"] = r["lateness_p99_ms"] <= 5 and r["delivery_p99_ms"] <= 5 and r["ok"] == r["requests"]
                results.append(r)
                print(f"rate {rate:6.0f} req/s  ok {r['ok']}/{r['requests']}  lateness p50/p99 "
                      f"{r['lateness_p50_ms']:.2f}/{r['lateness_p99_ms']:.2f} ms  delivery error p50/p99 "
                      f"{r['delivery_p50_ms']:.2f}/{r['delivery_p99_ms']:.2f} ms  CPU {r['cpu_us_per_token']:.1f} "
                      f"us/token  {'PASS' if r['pass'] else 'fail'}", flush=True)
                time.sleep(1.0)
    finally:
        if mock:
            mock.terminate()
            mock.wait(10)
    best = max((r["rate"] for r in results if r["pass"]), default=None)
    print(f"highest passing rate: {best} req/s ({args.workers} replayer process(es), "
          f"{args.tokens} tokens/stream {args.itl_ms:g} ms apart; mock server in its own process on the same cores)")
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                         "results": results, "best_rate": best}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
