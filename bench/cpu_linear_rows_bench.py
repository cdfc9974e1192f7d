"""Prefill steps of many lengths with the CPU linears' rows exact and padded to buckets, side by side.

oneDNN keeps the last 1,024 kernels it built, one per input shape; a served engine's steps have hundreds of
token counts, so with exact rows the cache thrashes and many steps pay for rebuilt kernels
(``engine/cpu_linear.py``). Each mode runs in its own process (the kernel cache is per process), the two
alternating: each process times ``--passes`` passes of prefill steps over every length in 65..``--max-rows``
in a shuffled order, one step each, and keeps the last pass's median (steady state: the cache as full as
the mode leaves it). Ratio = exact / bucketed, per-step times normalised by the step's rows.

    taskset -c 0 .venv/bin/python bench/cpu_linear_rows_bench.py --json bench/results/cpu-linear-rows.json
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

from loadgen.results.runmeta import git_commit, machine, now_iso, versions  # noqa: E402


def one_mode(mode: str, max_rows: int, passes: int, seed: int) -> dict:
    """In this process: the median step time (ms, and per 100 rows) of each pass over the lengths."""
    from engine import cpu_linear
    from engine.config import EngineConfig
    from engine.engine import Engine
    from engine.sampling import SamplingParams

    if mode == "exact":
        cpu_linear.EXACT_ROWS = 1 << 30  # bucket_rows returns the rows themselves
    engine = Engine(EngineConfig(model="tiny", max_num_batched_tokens=max_rows, prefill_chunk_size=max_rows,
                                 enable_prefix_caching=False))
    rng = random.Random(seed)
    lengths = list(range(65, max_rows + 1))
    out = []
    for _ in range(passes):
        rng.shuffle(lengths)
        per_100, raw = [], []
        for n in lengths:
            prompt = [rng.randrange(10, 250) for _ in range(n)]
            engine.add_request(prompt, SamplingParams(max_tokens=1, ignore_eos=True))
            t = time.perf_counter()
            while engine.has_unfinished_requests():
                engine.step()
            dt = time.perf_counter() - t
            raw.append(dt * 1e3)
            per_100.append(dt * 1e3 * 100 / n)
        out.append({"median_step_ms": statistics.median(raw), "median_ms_per_100_rows": statistics.median(per_100)})
    return {"mode": mode, "passes": out, "packed_linears": engine.packed_linears}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--max-rows", type=int, default=512)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2, help="processes per mode, alternating")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--mode", choices=("exact", "bucketed"), help=argparse.SUPPRESS)  # one child process
    args = ap.parse_args()
    if args.mode:
        print(json.dumps(one_mode(args.mode, args.max_rows, args.passes, 0)))
        return 0
    runs: dict[str, list[dict]] = {"exact": [], "bucketed": []}
    for r in range(args.rounds):
        for mode in ("exact", "bucketed"):
            p = subprocess.run([sys.executable, __file__, "--mode", mode, "--max-rows", str(args.max_rows),
                                "--passes", str(args.passes)], capture_output=True, text=True, cwd=REPO)
            if p.returncode != 0:
                raise SystemExit(f"{mode} run failed: {p.stderr[-2000:]}")
            res = json.loads(p.stdout.strip().splitlines()[-1])
            runs[mode].append(res)
            last = res["passes"][-1]
            print(f"round {r} {mode:8s}: last pass median {last['median_step_ms']:.2f} ms/step, "
                  f"{last['median_ms_per_100_rows']:.3f} ms per 100 rows", flush=True)
    med = {m: statistics.median(x["passes"][-1]["median_ms_per_100_rows"] for x in v) for m, v in runs.items()}
    ratio = med["exact"] / med["bucketed"]
    print(f"exact / bucketed (ms per 100 rows, steady state): {ratio:.2f}x")
    if args.json:
        doc = {"bench": "cpu-linear-rows", "when": now_iso(), "git_commit": git_commit(REPO), "machine": machine(),
               "versions": versions(), "max_rows": args.max_rows, "passes": args.passes, "runs": runs,
               "median_ms_per_100_rows": med, "exact_over_bucketed": ratio}
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
