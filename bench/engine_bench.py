"""Measure the reference engine's serving techniques side by side, in one run (issue: engine core).

    .venv/bin/python bench/engine_bench.py [--model tiny] [--requests 128] [--out bench/results/engine.json]

1. decode tokens/s at batch 1, 8, 32, 64 (median step time over steady decode steps);
2. continuous vs static batching throughput on a mixed-length workload (all requests queued at t=0);
3. KV fragmentation, paged vs contiguous (reserve prompt + max_tokens), averaged over every step, and the
   mean number of running requests each achieves with the same, constrained KV pool;
4. scheduler CPU time as a share of step time at re-batching intervals 1 and 4.

Timings on a shared 2-core machine are noisy: each comparison runs its variants back to back in this process
and reports ratios.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

from engine import Engine

# The measuring code lives in the engine's experiments package (`slobench experiments` runs the same); its
# config() keeps admission from shedding the queue at t = 0 that these runs start with.
from engine.experiments.drive import config, decode_rate, mixed_workload
from engine.experiments.drive import run_batch as run_workload


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--requests", type=int, default=128)
    ap.add_argument("--out", default="bench/results/engine.json")
    args = ap.parse_args()
    console = Console()
    results: dict = {"model": args.model, "requests": args.requests}

    console.rule("decode throughput")
    results["decode"] = [decode_rate(Engine(config(model=args.model, max_num_seqs=b, kv_cache_tokens=32768)), b)
                         for b in (1, 8, 32, 64)]
    t = Table("batch", "median step ms", "decode tok/s")
    for r in results["decode"]:
        t.add_row(str(r["batch"]), f"{r['median_step_ms']:.2f}", f"{r['decode_tok_s']:.0f}")
    console.print(t)

    work = mixed_workload(args.requests)
    base = {"model": args.model, "max_num_seqs": 32, "kv_cache_tokens": 65536}

    console.rule("continuous vs static batching (same workload)")
    cont = run_workload(Engine(config(**base)), work)
    static = run_workload(Engine(config(**base, batching="static")), work)
    results["batching"] = {"continuous": cont, "static": static,
                           "throughput_ratio": cont["output_tok_s"] / static["output_tok_s"]}
    console.print(f"continuous {cont['output_tok_s']:.0f} tok/s, static {static['output_tok_s']:.0f} tok/s: "
                  f"[bold]{results['batching']['throughput_ratio']:.2f}x[/]")

    console.rule("paged vs contiguous KV (pool of 8192 tokens, up to 64 sequences)")
    tight = {**base, "max_num_seqs": 64, "kv_cache_tokens": 8192, "enable_prefix_caching": False}
    variants = {
        "paged, block 16": (dict(tight), None),
        "paged, block 8": ({**tight, "block_size": 8}, None),
        "contiguous, max_tokens = length": ({**tight, "kv_allocation": "contiguous"}, None),
        "paged, max_tokens = 512": (dict(tight), 512),
        "contiguous, max_tokens = 512": ({**tight, "kv_allocation": "contiguous"}, 512),
    }
    kv = {name: run_workload(Engine(config(**cfg)), work, cap) for name, (cfg, cap) in variants.items()}
    results["kv_allocation"] = kv
    t = Table("allocation", "mean fragmentation", "mean running (queue non-empty)", "output tok/s")
    for name, r in kv.items():
        t.add_row(name, f"{r['mean_fragmentation']:.1%}", f"{r['mean_running_saturated']:.1f}",
                  f"{r['output_tok_s']:.0f}")
    console.print(t)
    for label, a, b in (("max_tokens = length", "paged, block 16", "contiguous, max_tokens = length"),
                        ("max_tokens = 512", "paged, max_tokens = 512", "contiguous, max_tokens = 512")):
        ratio = kv[a]["mean_running_saturated"] / kv[b]["mean_running_saturated"]
        results["kv_allocation"][f"concurrency_ratio ({label})"] = ratio
        console.print(f"{label}: paged runs [bold]{ratio:.2f}x[/] the sequences contiguous does")

    console.rule("scheduler overhead vs re-batching interval")
    overhead = {}
    for interval in (1, 4, 8):
        r = run_workload(Engine(config(**base, rebatch_interval=interval)), work)
        overhead[interval] = {"schedule_share": r["schedule_share"], "process_share": r["process_share"],
                              "output_tok_s": r["output_tok_s"]}
    results["rebatch_interval"] = overhead
    t = Table("interval", "scheduler share of step", "output processing share", "output tok/s")
    for k, r in overhead.items():
        t.add_row(str(k), f"{r['schedule_share']:.2%}", f"{r['process_share']:.2%}", f"{r['output_tok_s']:.0f}")
    console.print(t)

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    console.print(f"wrote {out}")


if __name__ == "__main__":
    main()
