"""Does torch.compile pay on the CPU engine? Its step times and the engine-speed work, eager beside compiled.

The engine ships eager: its linear layers on oneDNN-prepacked weights (`engine/cpu_linear.py`). This bench
compiles the model's forward with inductor (`torch.compile(dynamic=True)`, the token dimension symbolic so a
new batch size is not a new graph) and measures, in one process per variant, on one core:

- decode step time at 1 / 8 / 32 sequences (sampled at temperature 1) and a lone 160-token prefill step;
- useful output tok/s on the engine-speed work (32 prompts of 128 random ids, output lengths uniform 8-256,
  greedy, all at once; `bench/engine_speed_bench.py`'s), median of 3 runs;
- the warm-up spent compiling (the first steps of every shape the timed part meets).

Variants: `eager_packed` (what the engine runs), `eager_dense` (torch's `F.linear`), `compile_dense`
(inductor over the `F.linear` model), `compile_freeze` (inductor with `freezing`: it folds the weights in as
constants and prepacks them for oneDNN itself). Paged attention stays eager (`torch.compiler.disable`): its
loop over the batch's sequences would specialise every graph on the batch's composition. The prepacked model
is not compiled: its row bucketing is Python arithmetic on the row count, which a symbolic shape cannot take.

    taskset -c 0 .venv/bin/python bench/compile_bench.py --model /tmp/tiny-llama --json bench/results/torch-compile.json
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

VARIANTS = ("eager_packed", "eager_dense", "compile_dense", "compile_freeze")
PROMPT = 160


def compile_forward(model, freeze: bool) -> None:
    """Replace model.forward by an inductor-compiled equivalent (attention left eager)."""
    import torch
    import torch._inductor.config as inductor_config

    inductor_config.freezing = freeze
    attention = torch.compiler.disable(model.attention_fn)

    def body(input_ids, positions, meta, kv_caches):
        x = model.model.embed_tokens(input_ids)
        rope = model.rotary(positions, x.dtype)
        for layer, kv_cache in zip(model.model.layers, kv_caches, strict=True):
            x = layer(x, rope, meta, kv_cache, attention)
        return model.model.norm(x)

    compiled = torch.compile(body, dynamic=True)

    def forward(input_ids, positions, meta, kv_caches):
        with torch.inference_mode():
            return compiled(input_ids, positions, meta, kv_caches)

    model.forward = forward


def measure(variant: str, model_dir: str, repeats: int) -> dict:
    """One variant in this process: step times, the engine-speed work's tok/s, the compile warm-up."""
    import torch
    from engine_speed_bench import run_work, workload  # this script's own folder is on sys.path
    from torch._dynamo.utils import counters

    from engine import Engine, EngineConfig, SamplingParams

    torch.set_num_threads(1)
    engine = Engine(EngineConfig(model=model_dir, num_threads=1, admission="queue-length",
                                 enable_prefix_caching=False, pack_cpu_weights=variant == "eager_packed"))
    if variant.startswith("compile"):
        compile_forward(engine.model, freeze=variant == "compile_freeze")
    rng = random.Random(0)

    def run(batch: int, tokens: int, prompt: int = PROMPT, temperature: float = 1.0) -> list[float]:
        for _ in range(batch):
            engine.add_request([rng.randrange(10, 30000) for _ in range(prompt)],
                               SamplingParams(max_tokens=tokens, ignore_eos=True, temperature=temperature))
        times = []
        while engine.has_unfinished_requests():
            t = time.perf_counter()
            engine.step()
            times.append(time.perf_counter() - t)
        return times

    t0 = time.perf_counter()
    for batch in (1, 2, 8, 32, 5, 17):  # every graph the timed part meets: batch 1 and 2 specialise
        run(batch, 8)
    run(32, 8, prompt=128, temperature=0.0)
    warmup_s = time.perf_counter() - t0
    decode = {str(b): statistics.median(run(b, 60)[5:]) * 1e3 for b in (1, 8, 32)}  # past the prefill steps
    prefill = statistics.median(run(1, 1)[0] for _ in range(repeats)) * 1e3

    prompts, lengths = workload(0)
    work_s = [run_work(engine, prompts, lengths) for _ in range(3)]
    return {"variant": variant, "warmup_s": warmup_s, "decode_step_ms": decode, "prefill_step_ms": prefill,
            "work_seconds": work_s, "useful_tok_s": sum(lengths) / statistics.median(work_s),
            "graphs": counters["stats"].get("unique_graphs", 0),
            "graph_breaks": sum(counters["graph_break"].values())}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="/tmp/tiny-llama", help="a Hugging Face checkpoint folder")
    ap.add_argument("--repeats", type=int, default=30, help="timed prefill steps")
    ap.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    ap.add_argument("--json", type=Path)
    ap.add_argument("--one", choices=VARIANTS, help=argparse.SUPPRESS)  # internal: measure one variant, print it
    args = ap.parse_args()
    if not Path(args.model).is_dir():
        ap.error(f"{args.model}: no such checkpoint folder (../shared/tools/vllm-cpu/make_model.py builds one)")
    if args.one:
        print(json.dumps(measure(args.one, args.model, args.repeats)))
        return 0

    from loadgen.results.runmeta import git_commit, machine, now_iso, versions

    rows = {}
    for variant in args.variants:  # a process each: inductor's settings and caches stay out of the others
        done = subprocess.run([sys.executable, __file__, "--model", args.model, "--repeats", str(args.repeats),
                               "--one", variant], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            print(done.stderr[-3000:], file=sys.stderr)
            print(f"error: variant {variant} failed (exit {done.returncode})", file=sys.stderr)
            return 1
        rows[variant] = json.loads(done.stdout.strip().splitlines()[-1])
        print(json.dumps(rows[variant]), flush=True)
    base = rows.get("eager_packed")
    ratios = {}
    if base:  # > 1: the variant is faster than what the engine runs
        ratios = {v: {"decode": {b: base["decode_step_ms"][b] / r["decode_step_ms"][b] for b in r["decode_step_ms"]},
                      "prefill": base["prefill_step_ms"] / r["prefill_step_ms"],
                      "useful_tok_s": r["useful_tok_s"] / base["useful_tok_s"]}
                  for v, r in rows.items() if v != "eager_packed"}
        print(json.dumps({"speedup_vs_eager_packed": ratios}, indent=1))
    if args.json:
        out = {"bench": "compile_bench", "when": now_iso(), "commit": git_commit(), "machine": machine(),
               "versions": versions(), "model": args.model, "prompt_tokens": PROMPT, "variants": rows,
               "speedup_vs_eager_packed": ratios}
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
