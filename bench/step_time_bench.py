"""Where a CPU engine step's time goes, and what each of the engine-speed changes took out of it, side by side.

On one checkpoint (default: the engine-speed issue's 32,000-word Llama, ``../shared/tools/vllm-cpu/make_model.py``),
in one process, medians over many steps:

- decode step time at 1 / 8 / 32 sequences (sampled at temperature 1, as a served request without a
  ``temperature`` is) and a lone 160-token prefill step, with the linear layers on oneDNN-prepacked weights
  (``pack_cpu_weights``, the default) and on torch's ``F.linear``;
- the sampler on the largest batch of real logits a step of 32 requests sampled: drawn rows beside the
  per-row ``torch.multinomial`` and the single-pass CDF (a softmax and a cumulative sum over the whole
  vocabulary) it replaced, greedy rows with ``max(dim).indices`` beside ``argmax``;
- a prefill chunk's attention (SDPA) with three-dimensional operands (the unfused math path it used to take)
  and four-dimensional ones (torch's CPU flash kernel).

    taskset -c 0 .venv/bin/python bench/step_time_bench.py --model /tmp/tiny-llama --json bench/results/step-time.json
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from engine.config import EngineConfig  # noqa: E402
from engine.engine import Engine  # noqa: E402
from engine.sampling import SamplingParams  # noqa: E402
from engine.sequence import Sequence  # noqa: E402
from loadgen.results.runmeta import git_commit, machine, now_iso, versions  # noqa: E402

PROMPT = 160


def timed(fn, repeats: int) -> float:
    """Median seconds of fn() over repeats calls, after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def decode_step_ms(engine: Engine, batch: int, rng: random.Random) -> float:
    for _ in range(batch):
        engine.add_request([rng.randrange(10, 30000) for _ in range(PROMPT)],
                           SamplingParams(max_tokens=60, ignore_eos=True, temperature=1.0))
    times = []
    while engine.has_unfinished_requests():
        t = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - t)
    return statistics.median(times[5:]) * 1e3  # past the prefill steps


def prefill_step_ms(engine: Engine, rng: random.Random, repeats: int) -> float:
    def one() -> None:
        engine.add_request([rng.randrange(10, 30000) for _ in range(PROMPT)],
                           SamplingParams(max_tokens=1, ignore_eos=True))
        engine.step()
    return timed(one, repeats) * 1e3


def multinomial_rows(logits: torch.Tensor, temperature: float) -> list[int]:
    """The replaced sampler's loop: a softmax and a torch.multinomial per row."""
    return [int(torch.multinomial(torch.softmax(row / temperature, dim=-1), 1).item()) for row in logits]


def full_cdf_rows(logits: torch.Tensor, temperature: float) -> list[int]:
    """The replaced batched sampler: a softmax, one cumulative sum over the whole vocabulary, a search."""
    cdf = torch.softmax(logits / temperature, dim=-1).cumsum(dim=-1)
    point = torch.rand(logits.shape[0], 1) * cdf[:, -1:]
    return torch.searchsorted(cdf, point, right=True).squeeze(1).tolist()


def sampling_ms(engine: Engine, rng: random.Random, repeats: int) -> dict:
    captured = {}
    sample = engine.sampler.sample

    def capture(logits, seqs):  # keep the step that sampled the most rows
        if len(seqs) >= len(captured.get("seqs", ())):
            captured["logits"], captured["seqs"] = logits.clone(), list(seqs)
        return sample(logits, seqs)

    engine.sampler.sample = capture
    for _ in range(32):
        engine.add_request([rng.randrange(10, 30000) for _ in range(PROMPT)],
                           SamplingParams(max_tokens=8, ignore_eos=True, temperature=1.0))
    while engine.has_unfinished_requests():
        engine.step()
    engine.sampler.sample = sample
    logits, seqs = captured["logits"], captured["seqs"]
    drawn = timed(lambda: sample(logits, seqs), repeats) * 1e3
    per_row = timed(lambda: multinomial_rows(logits, 1.0), repeats) * 1e3
    full_cdf = timed(lambda: full_cdf_rows(logits, 1.0), repeats) * 1e3
    greedy_seqs = [Sequence(s.request_id, s.index, list(s.token_ids), s.num_prompt_tokens,
                            SamplingParams(temperature=0.0), s.tier, s.arrival_time) for s in seqs]
    greedy = timed(lambda: sample(logits, greedy_seqs), repeats) * 1e3
    max_indices = timed(lambda: logits.max(dim=-1).indices.tolist(), repeats) * 1e3
    argmax = timed(lambda: logits.argmax(dim=-1).tolist(), repeats) * 1e3
    return {"rows": logits.shape[0], "vocab": logits.shape[1], "two_level_cdf_ms": drawn,
            "full_cdf_ms": full_cdf, "per_row_multinomial_ms": per_row,
            "speedup_vs_multinomial": per_row / drawn, "speedup_vs_full_cdf": full_cdf / drawn,
            "greedy_sample_ms": greedy, "greedy_max_indices_ms": max_indices, "greedy_argmax_ms": argmax}


def prefill_attention_ms(repeats: int) -> dict:
    """One layer's attention for a 160-token chunk with no cached prefix (8 query heads, 2 KV heads, head 32)."""
    heads, kv_heads, dim = 8, 2, 32
    group = heads // kv_heads
    q = torch.randn(kv_heads, group * PROMPT, dim)
    k, v = torch.randn(kv_heads, PROMPT, dim), torch.randn(kv_heads, PROMPT, dim)
    pos = torch.arange(PROMPT)
    mask = (pos[None, :] <= pos[:, None]).repeat(group, 1)
    three = timed(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask), repeats) * 1e3
    four = timed(lambda: F.scaled_dot_product_attention(q[None], k[None], v[None], attn_mask=mask[None, None]),
                 repeats) * 1e3
    return {"three_dim_ms": three, "four_dim_ms": four, "speedup": three / four}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="/tmp/tiny-llama", help="a Hugging Face checkpoint folder")
    ap.add_argument("--repeats", type=int, default=30, help="timed calls per micro-measurement")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if not Path(args.model).is_dir():
        ap.error(f"{args.model}: no such checkpoint folder (../shared/tools/vllm-cpu/make_model.py builds one)")
    torch.set_num_threads(1)
    out: dict = {"bench": "step_time_bench", "when": now_iso(), "commit": git_commit(), "machine": machine(),
                 "versions": versions(), "model": args.model, "prompt_tokens": PROMPT, "linear": {}}
    for packed in (False, True):
        engine = Engine(EngineConfig(model=args.model, admission="queue-length", enable_prefix_caching=False,
                                     pack_cpu_weights=packed))
        rng = random.Random(0)
        name = "onednn_prepacked" if packed else "torch_f_linear"
        row = {"packed_layers": engine.packed_linears,
               "decode_step_ms": {b: decode_step_ms(engine, b, rng) for b in (1, 8, 32)},
               "prefill_step_ms": prefill_step_ms(engine, rng, args.repeats)}
        if packed:
            out["sampling"] = sampling_ms(engine, rng, args.repeats)
        out["linear"][name] = row
        print(name, json.dumps(row), flush=True)
    dense, packed = out["linear"]["torch_f_linear"], out["linear"]["onednn_prepacked"]
    out["linear"]["speedup"] = {
        "decode": {b: dense["decode_step_ms"][b] / packed["decode_step_ms"][b] for b in dense["decode_step_ms"]},
        "prefill": dense["prefill_step_ms"] / packed["prefill_step_ms"]}
    out["prefill_attention"] = prefill_attention_ms(args.repeats)
    print(json.dumps({k: out[k] for k in ("sampling", "prefill_attention")}, indent=1))
    print(json.dumps(out["linear"]["speedup"]))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
