"""Useful output tokens/s of the reference engine vs Hugging Face `generate` (and vLLM where it installs), side
by side on one core: the issue's work (engine speed).

The model: a random Llama (hidden 256, 4 layers, 8 heads, 2 KV heads, intermediate 688, a 32,000-word
vocabulary, float32), written here. The work: 32 prompts of 128 random token ids, output lengths uniform
8-256 (seeded), greedy, end-of-sequence ignored, all submitted at once. "Useful" tokens are the ones each
request asked for: `generate` runs one static batch to the longest output, so it computes 32 x max tokens
to deliver the sum of the lengths (its raw rate is reported too). Each engine gets a warm-up run first and
then `--repeats` timed runs (the median is reported). Run it pinned, on an otherwise idle machine:

    taskset -c 0 .venv/bin/python bench/engine_speed_bench.py --json bench/results/engine-speed.json \\
        [--vllm-python /tmp/venv_vllm/bin/python]     # vLLM's CPU build (../shared/tools/vllm-cpu)
"""

from __future__ import annotations

import argparse
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
    rng = random.Random(seed)
    prompts = [[rng.randrange(4, VOCAB) for _ in range(PROMPT_LEN)] for _ in range(NUM_PROMPTS)]
    return prompts, [rng.randint(OUT_MIN, OUT_MAX) for _ in range(NUM_PROMPTS)]


def run_work(engine, prompts: list[list[int]], lengths: list[int]) -> float:
    """Seconds for an `Engine` to answer every prompt with its length of greedy tokens, all submitted at once."""
    from engine import SamplingParams

    t0 = time.perf_counter()
    ids = [engine.add_request(p, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True))
           for p, n in zip(prompts, lengths, strict=True)]
    done = 0
    while done < len(ids):
        done += sum(1 for o in engine.step() if o.finished)
    return time.perf_counter() - t0


def time_engine(folder: Path, prompts: list[list[int]], lengths: list[int], repeats: int) -> dict:
    from engine import Engine, EngineConfig

    engine = Engine(EngineConfig(model=str(folder), num_threads=1, admission="queue-length"))
    run_work(engine, prompts, [8] * len(prompts))  # warm-up
    times = [run_work(engine, prompts, lengths) for _ in range(repeats)]
    t = statistics.median(times)
    return {"seconds": times, "useful_tok_s": sum(lengths) / t}


def time_hf_generate(folder: Path, prompts: list[list[int]], lengths: list[int], repeats: int) -> dict:
    import torch
    import transformers

    torch.set_num_threads(1)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32).eval()
    batch = torch.tensor(prompts)
    longest = max(lengths)

    def once(n: int) -> float:
        t0 = time.perf_counter()
        with torch.no_grad():
            model.generate(batch, attention_mask=torch.ones_like(batch), max_new_tokens=n, min_new_tokens=n,
                           do_sample=False, pad_token_id=3)
        return time.perf_counter() - t0

    once(8)
    times = [once(longest) for _ in range(repeats)]
    t = statistics.median(times)
    return {"seconds": times, "useful_tok_s": sum(lengths) / t, "raw_tok_s": len(prompts) * longest / t,
            "computed_tokens": len(prompts) * longest}


VLLM_SCRIPT = r"""
import json, statistics, sys, time
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt
folder, prompts, lengths, repeats = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3]), int(sys.argv[4])
llm = LLM(model=folder, dtype="float32", max_model_len=1024, enable_prefix_caching=False)
def once(lens):
    t0 = time.perf_counter()
    llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts],
                 [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in lens], use_tqdm=False)
    return time.perf_counter() - t0
once([8] * len(prompts))
times = [once(lengths) for _ in range(repeats)]
print("RESULT " + json.dumps({"seconds": times, "useful_tok_s": sum(lengths) / statistics.median(times)}))
"""


def time_vllm(python: str, folder: Path, prompts: list[list[int]], lengths: list[int], repeats: int) -> dict:
    env = {"HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "VLLM_CPU_KVCACHE_SPACE": "2",
           "VLLM_CPU_OMP_THREADS_BIND": "0", "PATH": "/usr/bin:/bin"}
    r = subprocess.run([python, "-c", VLLM_SCRIPT, str(folder), json.dumps(prompts), json.dumps(lengths),
                        str(repeats)], capture_output=True, text=True, env=env, timeout=1800)
    for line in r.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    return {"error": (r.stderr or r.stdout)[-2000:], "returncode": r.returncode}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--vllm-python", help="a Python with vLLM's CPU build (../shared/tools/vllm-cpu/install.sh)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    prompts, lengths = workload(args.seed)
    out: dict = {"bench": "engine_speed_bench", "when": now_iso(), "commit": git_commit(), "machine": machine(),
                 "versions": versions(), "work": {"prompts": NUM_PROMPTS, "prompt_len": PROMPT_LEN,
                                                  "output_lengths": f"uniform {OUT_MIN}-{OUT_MAX}",
                                                  "useful_tokens": sum(lengths), "seed": args.seed},
                 "repeats": args.repeats}
    with tempfile.TemporaryDirectory() as tmp:
        folder = build_checkpoint(Path(tmp) / "llama-32k")
        out["slobench_engine"] = time_engine(folder, prompts, lengths, args.repeats)
        print(f"slobench Engine: {out['slobench_engine']['useful_tok_s']:.0f} useful tok/s", flush=True)
        out["hf_generate"] = time_hf_generate(folder, prompts, lengths, args.repeats)
        print(f"HF generate: {out['hf_generate']['useful_tok_s']:.0f} useful tok/s "
              f"({out['hf_generate']['raw_tok_s']:.0f} raw)", flush=True)
        if args.vllm_python:
            out["vllm"] = time_vllm(args.vllm_python, folder, prompts, lengths, args.repeats)
            print(f"vLLM: {out['vllm']}", flush=True)
    eng = out["slobench_engine"]["useful_tok_s"]
    out["ratios"] = {"engine_over_hf_generate": eng / out["hf_generate"]["useful_tok_s"]}
    if "useful_tok_s" in out.get("vllm", {}):
        out["ratios"]["engine_over_vllm"] = eng / out["vllm"]["useful_tok_s"]
    print(json.dumps(out["ratios"]))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
