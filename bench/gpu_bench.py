"""The engine on a GPU, every figure the engine-speed issue asks for in one run (prepared; see "Status" below).

1. **Greedy parity**: the Triton paged-attention path against the torch reference, same weights, same prompts
   (mixed lengths, a shared prefix so that later prompts hit the prefix cache): the share of identical tokens
   and where each prompt's outputs first diverge (bfloat16 near-ties may flip a late token).
2. **Decode step time against the HBM roofline**: for each batch size, the median time of a decode step once
   every sequence is prefilled (after ``--decode-warmup`` untimed steps), beside the time the step's bytes take
   at the accelerator's bandwidth (all weights once, plus every sequence's cached K/V): ``roofline_fraction`` =
   roofline / measured. Every timed step runs exactly the row's batch: the sequences' max_tokens outlast the
   timed steps (they are aborted after them), ``running_seqs`` gives min/median/max of the sequences each timed
   step ran, and any other count stops the bench with an error instead of a row.
3. **Prefill tokens/s** of one long prompt per step, against the accelerator's dense FLOPs (2 x parameters per
   token, plus causal attention).

The model is a random-weight Llama of the named shape (``--shape``: ``1b`` is Llama-3.2-1B's layers; built in
memory, nothing downloaded). The roofline's figures: ``--hardware`` names one of ``slobench plan``'s profiles
(``loadgen/planning/hardware.py``); by default the datasheet row of ``DEVICES`` whose name is exactly the CUDA
device's (``device_profile``), or on the CPU the host measured here. A CUDA device not in ``DEVICES`` gets no
roofline (``hardware`` and the fractions are null, ``hardware_source`` says why), never a guess.

    .venv/bin/python bench/gpu_bench.py --json bench/results/gpu.json                 # on a CUDA machine
    .venv/bin/python bench/gpu_bench.py --device cpu --shape small --batches 1 4 \\
        --context 64 --prefill-tokens 256 --json /tmp/gpu-bench-cpu.json           # the script itself, on a CPU
    TRITON_INTERPRET=1 .venv/bin/python bench/gpu_bench.py --device cpu --shape tiny ...  # parity too, interpreted

On CUDA the engine replays its decode steps from CUDA graphs (``decode_graphs="auto"``, engine/model/decode_graphs.py),
so the parity check covers the captured path, and the decode steps are timed again with graphs off
(``decode_without_graphs``) for the graphs' own gain. ``cuda_graphs`` in the result says whether they were
captured (never on the CPU).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

import torch  # noqa: E402

from engine.core.engine import Engine  # noqa: E402
from engine.model import loader  # noqa: E402
from engine.request.config import EngineConfig  # noqa: E402
from engine.request.sampling import SamplingParams  # noqa: E402
from loadgen.planning.hardware import ACCELERATORS, GB, TB, Accelerator, measure_host  # noqa: E402
from loadgen.planning.model_shape import ModelShape, from_config  # noqa: E402
from loadgen.results.runmeta import git_commit, machine, now_iso, versions  # noqa: E402

SHAPES = {  # a byte-level vocabulary: the output layer stays small, the decoder is the named model's
    "1b": {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32,
           "num_key_value_heads": 8, "head_dim": 64},
    "tiny": {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 2,
             "num_key_value_heads": 1, "head_dim": 64},  # the parity check interpreted on a CPU, in the tests
    "small": {"hidden_size": 512, "intermediate_size": 1536, "num_hidden_layers": 8, "num_attention_heads": 8,
              "num_key_value_heads": 4, "head_dim": 64},
}


def register_shape(shape: str) -> str:
    name = f"gpu-bench-{shape}"
    loader.PRESETS[name] = dataclasses.replace(loader.PRESETS["small"], **SHAPES[shape], max_position_embeddings=32768)
    return name


def make_engine(model: str, args: argparse.Namespace, *, use_triton: bool | None, max_seqs: int,
                decode_graphs: str = "auto") -> Engine:
    return Engine(EngineConfig(model=model, device=args.device, dtype=args.dtype, use_triton=use_triton,
                               decode_graphs=decode_graphs,
                               admission="queue-length", max_num_seqs=max_seqs,
                               max_num_batched_tokens=max(args.prefill_tokens, 2048),
                               prefill_chunk_size=max(args.prefill_tokens, 2048),
                               kv_cache_tokens=args.kv_tokens, num_host_blocks=0,
                               max_waiting_per_tier={"standard": 4096}))


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def attention_name(engine: Engine) -> str:
    return getattr(engine.model.attention_fn, "__name__", str(engine.model.attention_fn))


def parity(model: str, args: argparse.Namespace) -> dict:
    if importlib.util.find_spec("triton") is None:
        return {"skipped": "triton is not installed"}
    if not args.device.startswith("cuda") and os.environ.get("TRITON_INTERPRET") != "1":
        return {"skipped": "no CUDA device: set TRITON_INTERPRET=1 to run the Triton kernel interpreted"}
    rng = random.Random(1)
    shared = [rng.randrange(3, 250) for _ in range(48)]
    prompts = [shared + [rng.randrange(3, 250) for _ in range(n)] for n in args.parity_lengths]
    params = SamplingParams(max_tokens=args.parity_tokens, temperature=0.0, ignore_eos=True)
    outs, attention = {}, {}
    for use_triton in (True, False):  # Triton (with decode graphs on CUDA) against the torch reference (eager)
        engine = make_engine(model, args, use_triton=use_triton, max_seqs=len(prompts),
                             decode_graphs="auto" if use_triton else "off")
        attention[use_triton] = attention_name(engine)
        outs[use_triton] = [o.token_ids for o in engine.generate(prompts, params)]
        del engine
    same = sum(a == b for t, r in zip(outs[True], outs[False], strict=True) for a, b in zip(t, r, strict=True))
    total = sum(len(t) for t in outs[False])
    first = [next((i for i, (a, b) in enumerate(zip(t, r, strict=True)) if a != b), None)
             for t, r in zip(outs[True], outs[False], strict=True)]
    return {"prompts": len(prompts), "prompt_lengths": [len(p) for p in prompts], "tokens_each": args.parity_tokens,
            "identical_token_share": same / total, "first_divergence": first, "all_identical": same == total,
            "attention": {"triton": attention[True], "reference": attention[False]}}


def shape_of(engine: Engine) -> ModelShape:
    """The planner's sizes of the engine's model (bytes of its weights and KV, FLOPs per token)."""
    return from_config(engine.model_config, engine.runner.kv_caches[0][0].element_size())


def decode_max_tokens(kv_tokens: int, batch: int, context: int, block_size: int, max_model_len: int) -> int:
    """max_tokens for each of ``batch`` decoding sequences: its whole share of the KV cache (whole blocks), within
    the model's length. Far more than the timed steps need, so that no sequence ends before them (the row is
    aborted after its timed steps); how many ran in each timed step is still counted (``running_seqs``)."""
    share = kv_tokens // batch // block_size * block_size
    return min(share, max_model_len) - context


def running_seqs(counts: list[int], batch: int) -> dict:
    """min/median/max of the sequences that ran in each timed step; a RuntimeError unless every one ran
    ``batch``: a row's step time is the named batch's, or there is no row."""
    if not counts or any(c != batch for c in counts):
        raise RuntimeError(f"decode batch {batch}: the timed steps ran {counts} sequences, not {batch} each "
                           "(a sequence finished, was preempted or never started; raise --kv-tokens?)")
    return {"min": min(counts), "median": statistics.median(counts), "max": max(counts)}


def timed_step(engine: Engine, device: str) -> tuple[float, int, int]:
    """One engine step: its seconds, the KV tokens of the sequences it holds, and how many of them it ran (gained
    a token in it: a finished one too, a preempted one not)."""
    seqs = [s for r in engine.requests.values() for s in r.seqs]
    before = [s.num_output_tokens for s in seqs]
    context = sum(s.num_tokens for s in seqs)
    sync(device)
    t = time.perf_counter()
    engine.step()  # the sampled tokens come back to the host: the step has finished on the device
    elapsed = time.perf_counter() - t
    return elapsed, context, sum(s.num_output_tokens > b for s, b in zip(seqs, before, strict=True))


def decode_row(engine: Engine, args: argparse.Namespace, hw: Accelerator | None, shape: ModelShape,
               batch: int, rng: random.Random) -> dict:
    max_tokens = decode_max_tokens(engine.block_manager.num_blocks * engine.config.block_size, batch,
                                   args.context, engine.config.block_size, engine.max_model_len)
    if max_tokens <= args.decode_warmup + args.decode_steps:
        raise SystemExit(f"decode batch {batch}: each sequence's share of the KV cache leaves {max_tokens} tokens, "
                         f"not more than the {args.decode_warmup + args.decode_steps} steps: raise --kv-tokens")
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0)
    ids = [engine.add_request([rng.randrange(3, 250) for _ in range(args.context)], params, slo_admission=False)
           for _ in range(batch)]
    engine.step()  # takes the new requests in
    while not all(r.seqs and r.seqs[0].num_output_tokens > 0 for r in engine.requests.values()):
        engine.step()  # prefill everything first
    for _ in range(args.decode_warmup):
        engine.step()
    times, contexts, counts = [], [], []
    for _ in range(args.decode_steps):
        step_s, context, ran = timed_step(engine, args.device)
        times.append(step_s)
        contexts.append(context)
        counts.append(ran)
    for request_id in ids:  # their max_tokens outlast the timed steps by far: end them here
        engine.abort(request_id)
    while engine.has_unfinished_requests():
        engine.step()
    running = running_seqs(counts, batch)
    step_s = statistics.median(times)
    bytes_ = shape.weights_bytes + statistics.median(contexts) * shape.kv_bytes_per_token
    roofline_s = bytes_ / hw.bandwidth_bytes_s if hw else None
    row = {"batch": batch, "context": args.context, "running_seqs": running, "step_ms": step_s * 1e3,
           "tokens_per_s": batch / step_s, "bytes_per_step": bytes_,
           "roofline_ms": roofline_s * 1e3 if hw else None, "roofline_fraction": roofline_s / step_s if hw else None}
    roof = f"roofline {roofline_s * 1e3:.3f} ms ({roofline_s / step_s:.0%})" if hw else "no roofline"
    print(f"decode batch {batch:4d}: {step_s * 1e3:8.3f} ms/step, {roof}; running {running}", flush=True)
    return row


def decode(engine: Engine, args: argparse.Namespace, hw: Accelerator | None) -> list[dict]:
    """Per batch size, the median decode step with exactly that many sequences running in every timed step (the
    row says so in ``running_seqs``, or the bench stops with an error), beside its roofline."""
    rng = random.Random(2)
    shape = shape_of(engine)
    return [decode_row(engine, args, hw, shape, batch, rng) for batch in args.batches]


def prefill(engine: Engine, args: argparse.Namespace, hw: Accelerator | None) -> dict:
    rng = random.Random(3)
    shape = shape_of(engine)
    n = args.prefill_tokens
    # Every token through every weight (the output layer only for the last), and causal attention: n^2 / 2 pairs.
    flops = (shape.matmul_flops_per_token - 2 * shape.vocab * shape.hidden) * n + 2 * shape.vocab * shape.hidden \
        + shape.attention_flops_per_pair * n * n // 2

    def one() -> None:
        engine.add_request([rng.randrange(3, 250) for _ in range(n)], SamplingParams(max_tokens=1, ignore_eos=True))
        engine.step()  # the whole prompt in one step (chunk and budget are n)

    one()
    times = []
    for _ in range(args.prefill_repeats):
        sync(args.device)
        t = time.perf_counter()
        one()
        times.append(time.perf_counter() - t)
    step_s = statistics.median(times)
    return {"tokens": n, "step_ms": step_s * 1e3, "tokens_per_s": n / step_s, "flops": flops,
            "flops_fraction": flops / step_s / hw.flops if hw else None}


# The CUDA devices this bench may run on, by the exact name ``torch.cuda.get_device_name()`` gives: a substring
# would give an H100 PCIe (2.0 TB/s) the SXM part's 3.35 TB/s. Figures from the vendors' datasheets, dense bf16
# (half the "with sparsity" figure the sheets print), "GB" as printed (10^9 bytes):
# - NVIDIA H100 Tensor Core GPU datasheet: H100 SXM 80 GB, 3.35 TB/s, 1,979 sparse; H100 NVL 94 GB, 3.9 TB/s,
#   1,671 sparse; H100 PCIe (the sheet's earlier edition) 80 GB, 2 TB/s, 1,513 sparse.
# - NVIDIA H200 Tensor Core GPU datasheet: H200 SXM 141 GB, 4.8 TB/s, 1,979 sparse; H200 NVL 141 GB, 4.8 TB/s,
#   1,671 sparse.
# - NVIDIA A100 Tensor Core GPU datasheet: 312 dense; 40GB PCIe 1,555 GB/s, 80GB PCIe 1,935 GB/s, 40GB SXM
#   1,555 GB/s, 80GB SXM 2,039 GB/s.
# - NVIDIA L4 datasheet: 24 GB, 300 GB/s, 242 sparse. NVIDIA L40S datasheet: 48 GB, 864 GB/s, 362.05 dense.
# - NVIDIA DGX B200 datasheet, per GPU: 180 GB, 8 TB/s, 2,250 dense (as loadgen/planning/hardware.py).
DEVICES: dict[str, Accelerator] = {name: Accelerator(label, mem * GB, bw * TB, tflops * 1e12, sheet)
                                   for name, label, mem, bw, tflops, sheet in (
    ("NVIDIA H100 80GB HBM3", "H100 SXM", 80, 3.35, 989.5, "NVIDIA H100 datasheet (SXM)"),
    ("NVIDIA H100 NVL", "H100 NVL", 94, 3.9, 835.5, "NVIDIA H100 datasheet (NVL)"),
    ("NVIDIA H100 PCIe", "H100 PCIe", 80, 2.0, 756.5, "NVIDIA H100 datasheet (PCIe)"),
    ("NVIDIA H200", "H200 SXM", 141, 4.8, 989.5, "NVIDIA H200 datasheet (SXM)"),
    ("NVIDIA H200 NVL", "H200 NVL", 141, 4.8, 835.5, "NVIDIA H200 datasheet (NVL)"),
    ("NVIDIA A100-SXM4-80GB", "A100 80GB SXM", 80, 2.039, 312, "NVIDIA A100 datasheet (80GB SXM)"),
    ("NVIDIA A100-SXM4-40GB", "A100 40GB SXM", 40, 1.555, 312, "NVIDIA A100 datasheet (40GB SXM)"),
    ("NVIDIA A100 80GB PCIe", "A100 80GB PCIe", 80, 1.935, 312, "NVIDIA A100 datasheet (80GB PCIe)"),
    ("NVIDIA A100-PCIE-40GB", "A100 40GB PCIe", 40, 1.555, 312, "NVIDIA A100 datasheet (40GB PCIe)"),
    ("NVIDIA L4", "L4", 24, 0.300, 121, "NVIDIA L4 datasheet"),
    ("NVIDIA L40S", "L40S", 48, 0.864, 362.05, "NVIDIA L40S datasheet"),
    ("NVIDIA B200", "B200", 180, 8.0, 2250, "NVIDIA DGX B200 datasheet (per GPU)"),
)}


def device_profile(name: str) -> Accelerator | None:
    """The datasheet figures of the CUDA device named exactly ``name``; None for any other name (no guess)."""
    return DEVICES.get(name)


def hardware(args: argparse.Namespace) -> tuple[Accelerator | None, str]:
    """The roofline's figures and where they come from; None (and why) for a CUDA device not in DEVICES."""
    if args.hardware:
        acc = ACCELERATORS[args.hardware.lower()]
        return acc, f"--hardware {args.hardware}: {acc.source}"
    if args.device.startswith("cuda"):
        name = torch.cuda.get_device_name()
        acc = device_profile(name)
        if acc is None:
            return None, f"no datasheet figures for {name!r}: no roofline (pass --hardware to name a profile)"
        return acc, f"{name!r}: {acc.source}"
    acc = measure_host(threads=torch.get_num_threads(), dtype=args.dtype or "float32")
    return acc, acc.source


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default=None, help="default: bfloat16 on CUDA, float32 on the CPU (the engine's)")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="1b")
    ap.add_argument("--hardware", help=f"roofline profile: {', '.join(a.name for a in ACCELERATORS.values())}")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 64, 128, 256])
    ap.add_argument("--context", type=int, default=512, help="prompt tokens of each decoding sequence")
    ap.add_argument("--decode-steps", type=int, default=32, help="timed decode steps per batch size")
    ap.add_argument("--decode-warmup", type=int, default=2, help="untimed decode steps before them")
    ap.add_argument("--prefill-tokens", type=int, default=4096)
    ap.add_argument("--prefill-repeats", type=int, default=5)
    ap.add_argument("--parity-tokens", type=int, default=48)
    ap.add_argument("--parity-lengths", type=int, nargs="+", default=[1, 17, 80, 200, 5, 333],
                    help="the parity prompts' lengths after their shared 48-token prefix")
    ap.add_argument("--kv-tokens", type=int, default=1 << 18)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        ap.error("no CUDA device here: pass --device cpu to check the script on a CPU")
    model = register_shape(args.shape)
    hw, hw_note = hardware(args)
    print("roofline figures:", hw_note, flush=True)
    out = {"bench": "gpu_bench", "when": now_iso(), "commit": git_commit(), "machine": machine(),
           "versions": versions(), "device": torch.cuda.get_device_name() if args.device.startswith("cuda")
           else "cpu", "hardware": hw.as_dict() if hw else None,
           "hardware_source": hw_note, "shape": {args.shape: SHAPES[args.shape]}}
    out["parity"] = parity(model, args)
    print("parity", json.dumps(out["parity"]), flush=True)
    engine = make_engine(model, args, use_triton=None, max_seqs=max(args.batches))
    out["dtype"] = str(engine.dtype).removeprefix("torch.")
    out["attention"] = attention_name(engine)
    out["model"] = shape_of(engine).as_dict()
    graphs = engine.runner.decode_graphs
    out["cuda_graphs"] = bool(graphs is not None and graphs.captured)
    out["graph_batch_sizes"] = graphs.sizes if out["cuda_graphs"] else []
    out["decode"] = decode(engine, args, hw)
    out["prefill"] = prefill(engine, args, hw)
    print("prefill", json.dumps(out["prefill"]), flush=True)
    if out["cuda_graphs"]:  # the same steps without graphs: what replaying them took off
        del engine, graphs
        torch.cuda.empty_cache()
        eager = make_engine(model, args, use_triton=None, max_seqs=max(args.batches), decode_graphs="off")
        out["decode_without_graphs"] = decode(eager, args, hw)
        out["graph_speedup"] = {row["batch"]: e["step_ms"] / row["step_ms"]
                                for row, e in zip(out["decode"], out["decode_without_graphs"], strict=True)}
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
