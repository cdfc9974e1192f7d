"""Tiers on the wire against a real vLLM (its CPU build): priorities sent vs not sent at one overload, side by
side, and a server that sheds (a queue cap) rated with and without a shed budget.

vLLM serves one core (``taskset -c 0``, ``--scheduling-policy priority``), slobench drives it from the other.

1. **Priorities.** A two-tier workload (premium 1 : standard 4, p99 TTFT 500 / 2000 ms) at ``--rate`` req/s (past
   the server's capacity) for ``--duration`` s, with ``client.send_priority`` true, then false, alternated
   ``--repeats`` times: each tier's p99 TTFT, goodput and outcome classes.
2. **Shedding.** The same server restarted with ``--max-num-queued-reqs`` (it answers 503 past the cap), rated by
   ``slobench capacity`` with every refusal a miss, and again with a shed budget (``slo.max_shed``): the
   ratings, and the outcome classes of the rated and first failing steps.

    python bench/vllm_tiers_bench.py --vllm-bin /tmp/venv_vllm/bin --model /tmp/tiny-llama --json FILE
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

from bench.engine_core_bench import warm_up
from loadgen.results.runmeta import git_commit, machine, now_iso, versions
from loadgen.target.embedded import free_port, wait_healthy

REPO = Path(__file__).resolve().parents[1]
WORKLOAD = "workload: {input_len: 128, output_len: 32}\n"
TIERS = ("tiers:\n  premium: {{weight: 1, slo: {{ttft_ms: 500{shed}}}}}\n"
         "  standard: {{weight: 4, slo: {{ttft_ms: 2000{shed}}}}}\n")


def serve(vllm_bin: str, model: str, port: int, log: Path, queue_cap: int | None) -> subprocess.Popen:
    env = {"HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "VLLM_CPU_KVCACHE_SPACE": "2",
           "VLLM_CPU_OMP_THREADS_BIND": "0", "PATH": "/usr/bin:/bin"}
    cmd = ["taskset", "-c", "0", str(Path(vllm_bin) / "vllm"), "serve", model, "--host", "127.0.0.1", "--port",
           str(port), "--dtype", "float32", "--max-model-len", "2048", "--max-num-seqs", "32",
           "--served-model-name", "tiny-llama", "--scheduling-policy", "priority", "--no-enable-prefix-caching",
           "--enable-per-request-metrics"]
    if queue_cap is not None:
        cmd += ["--max-num-queued-reqs", str(queue_cap)]
    return subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env)


def slobench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["taskset", "-c", "1", sys.executable, "-m", "loadgen.cli", *args], cwd=REPO,
                          capture_output=True, text=True)


def tier_figures(summary: dict) -> dict:
    tiers = summary.get("tiers") or {}
    return {t: {"p99_ttft_ms": e.get("p99_ttft_ms"), "outcomes": e.get("outcomes"),
                "good": (e.get("outcomes") or {}).get("good")} for t, e in tiers.items()}


def priorities(url: str, work: Path, rate: float, duration: float, repeats: int) -> dict:
    runs = []
    for rep in range(repeats):
        for send in (True, False):
            scn = work / f"prio-{send}-{rep}.yaml"
            load = f"load: {{arrival: poisson, rate: {rate}, duration_s: {duration}}}\n"
            scn.write_text(f"name: tiers-{'sent' if send else 'unsent'}\nseed: {rep}\n{WORKLOAD}"
                           + TIERS.format(shed="") + load + f"client: {{send_priority: {str(send).lower()}}}\n")
            out = work / f"prio-{send}-{rep}"
            r = slobench("run", str(scn), "--target", url, "--model", "tiny-llama", "--out", str(out), "--no-report",
                         "--no-progress")
            s = json.loads((out / "summary.json").read_text()) if (out / "summary.json").exists() else {}
            fit = s.get("request_fit") or {}
            runs.append({"repeat": rep, "priority_sent": send, "returncode": r.returncode,
                         "sent_priorities": (fit.get("shape") or {}).get("priorities"),
                         "duration_s": s.get("duration"), "tiers": tier_figures(s), "outcomes": s.get("outcomes"),
                         "goodput_rps": {t: (e["good"] or 0) / s["duration"] for t, e in tier_figures(s).items()}
                         if s.get("duration") else None})
            figures = ", ".join(f"{t} p99 TTFT {e['p99_ttft_ms']} ms, {e['outcomes']}"
                                for t, e in runs[-1]["tiers"].items())
            print(f"  priority {'sent' if send else 'not sent'} (repeat {rep + 1}): {figures}", flush=True)

    def med(send: bool, tier: str, key: str) -> float | None:
        vals = [x["tiers"][tier][key] if key != "goodput_rps" else x["goodput_rps"][tier]
                for x in runs if x["priority_sent"] is send and tier in x["tiers"]]
        vals = [v for v in vals if v is not None]
        return statistics.median(vals) if vals else None

    medians = {("sent" if send else "not_sent"): {t: {k: med(send, t, k) for k in ("p99_ttft_ms", "goodput_rps")}
                                                   for t in ("premium", "standard")} for send in (True, False)}
    return {"rate_rps": rate, "duration_s": duration, "repeats": repeats, "runs": runs, "medians": medians}


def shedding(url: str, work: Path, budget: float) -> dict:
    out = {}
    for name, shed in (("no_budget", ""), ("budget", f", max_shed: {budget}")):
        scn = work / f"shed-{name}.yaml"
        scn.write_text(f"name: shed-{name}\n{WORKLOAD}" + TIERS.format(shed=shed)
                       + "search: {start: 4, max_duration_s: 300}\nclient: {send_priority: true}\n")
        run = work / f"shed-{name}"
        r = slobench("capacity", str(scn), "--target", url, "--model", "tiny-llama", "--out", str(run), "--no-report",
                     "--no-progress")
        s = json.loads((run / "summary.json").read_text()) if (run / "summary.json").exists() else {}
        rc = s.get("rated_capacity") or {}
        steps = s.get("steps") or []
        rated = next((st for st in steps if st.get("index") == rc.get("step")), None)
        failing = (rc.get("cause") or {}).get("failing_step")
        fail = next((st for st in steps if st.get("index") == failing), None)
        out[name] = {"returncode": r.returncode, "verdict": s.get("verdict"), "rated_rps": rc.get("rate_rps"),
                     "cause": rc.get("cause"), "max_shed": budget if shed else 0.0,
                     "rated_step_outcomes": {t: e.get("outcomes") for t, e in (rated or {}).get("tiers", {}).items()},
                     "failing_step_outcomes": {t: e.get("outcomes") for t, e in (fail or {}).get("tiers", {}).items()},
                     "shed_unjudged_at_rated": {t: e.get("shed_unjudged") for t, e in (rated or {}).get("tiers",
                                                                                                      {}).items()}}
        print(f"  {name}: rated {rc.get('rate_rps')} req/s, cause {(rc.get('cause') or {}).get('cause')}", flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vllm-bin", default="/tmp/venv_vllm/bin")
    ap.add_argument("--model", default="/tmp/tiny-llama")
    ap.add_argument("--rate", type=float, default=45.0, help="the overload, req/s (default 45)")
    ap.add_argument("--duration", type=float, default=20.0)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--queue-cap", type=int, default=48, help="--max-num-queued-reqs for the shedding part")
    ap.add_argument("--max-shed", type=float, default=0.05, help="the shed budget of the second rating")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    result: dict = {"bench": "vllm_tiers", "started_at": now_iso(), "git_commit": git_commit(), "machine": machine(),
                    "versions": versions(), "vllm": "--scheduling-policy priority, one core"}
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for part, cap in (("priorities", None), ("shedding", args.queue_cap)):
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            server = serve(args.vllm_bin, args.model, port, work / f"vllm-{part}.log", cap)
            try:
                wait_healthy(url, server, 300)
                warm_up(url, "tiny-llama")
                print(f"{part} (vLLM{' --max-num-queued-reqs ' + str(cap) if cap else ''}) ...", flush=True)
                result[part] = (priorities(url, work, args.rate, args.duration, args.repeats) if cap is None
                                else {"queue_cap": cap, **shedding(url, work, args.max_shed)})
            finally:
                server.terminate()
                server.wait(60)
    result["wall_s"] = round(time.monotonic() - t0, 1)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
