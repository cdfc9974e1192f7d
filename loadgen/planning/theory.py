"""Capacity planning in closed form: memory, KV, batch, step time, throughput, the SLO load, replicas.

- weights = parameters x bytes; KV per token = 2 x layers x KV heads x head dim x bytes;
- the KV pool = memory x tp x ``mem_util`` - weights (or the engine's configured pool);
- a request's KV over its life, paged: while it holds ``P + j`` tokens (decode step j of L) it holds
  ceil((P + j) / block) blocks; the time average and the peak (P + L - 1 tokens) are both given; a shared
  system prompt's full blocks are counted once per distinct prompt, not per request (prefix sharing);
- the largest batch memory allows = (pool - shared prompts) / per-request KV, at most ``max_num_seqs``;
- a step costs the step model's time (theory: overhead + max(bytes / bandwidth, FLOPs / compute));
- throughput (the design claims' formula): requests/s = batch / (steps a request holds a slot x step time), output
  tokens/s = batch x (1 / step time) x the mean output rate (tokens a slot yields per step: L / (L - 1 +
  prefill steps)); prefill tokens interleave with decodes, so the step time is solved self-consistently;
- TTFT ~ queue + prefill: the queue is an M/M/c one (c = the batch, the service time a request's slot
  holding time; Erlang C; deterministic service waits about half as long, so this leans safe) and its
  quantile P(W > t) = C exp(-(c mu - lambda) t); the rated load is the highest whose quantile TTFT is within
  the tightest TTFT SLO (tiers pooled: priority is the simulation's job);
- replicas for a target load = ceil(target / (per-replica load x (1 - headroom))), GPUs = replicas x tp.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from loadgen.planning.requests import Requests
from loadgen.planning.step_model import StepModel, decode_step_s

TP_DEGREES = (1, 2, 4, 8)


def kv_pool_tokens(weights_bytes: float, kv_bytes_per_token: float, memory_bytes: float, tp: int = 1,
                   mem_util: float = 0.9) -> int:
    """KV tokens the devices hold next to the weights (0 when the weights alone do not fit)."""
    free = memory_bytes * tp * mem_util - weights_bytes
    return max(0, int(free // kv_bytes_per_token))


def blocks_sum(x: np.ndarray, b: int) -> np.ndarray:
    """sum_{y=1..x} ceil(y / b), in closed form (x >= 0)."""
    q, r = np.divmod(np.asarray(x, dtype=np.int64), b)
    return b * q * (q + 1) // 2 + r * (q + 1)


@dataclass(frozen=True)
class RequestKV:
    """A request's KV in tokens (blocks x block size), over the scenario's length distributions."""

    mean_tokens: float  # time-averaged over its decode steps, paged, its shared prompt's blocks excluded
    peak_tokens: float  # at its last token, paged, shared blocks excluded (the mean over requests)
    max_peak_tokens: int  # the longest request's peak, shared blocks included: what must fit alone
    shared_tokens: int  # distinct shared prompts' full blocks, held once
    mean_in: float
    mean_uncached_in: float  # prompt tokens prefilled (the shared prompt's full blocks come from the cache)
    mean_out: float

    def as_dict(self) -> dict:
        return asdict(self)


def request_kv(req: Requests, block: int, prefix_caching: bool = True) -> RequestKV:
    p, L = req.n_in.astype(np.int64), req.n_out.astype(np.int64)
    shared = np.where((req.prefix >= 0) & prefix_caching, req.prefix_len // block, 0)
    life = blocks_sum(p + L - 1, block) - blocks_sum(p - 1, block)  # sum over j < L of ceil((p + j) / block)
    mean = (life / L - shared) * block
    peak = (-(-(p + L - 1) // block) - shared) * block
    distinct = {int(k): int(v) for k, v in zip(req.prefix[shared > 0], shared[shared > 0], strict=True)}
    return RequestKV(float(mean.mean()), float(peak.mean()), int((-(-(p + L - 1) // block) * block).max()),
                     sum(distinct.values()) * block, float(p.mean()), float((p - shared * block).mean()),
                     float(L.mean()))


def max_batch(pool_tokens: int, per_request_tokens: float, shared_tokens: int, max_num_seqs: int | None) -> int:
    """The largest batch the KV pool holds (and the engine's slot limit allows)."""
    b = int(max(0, pool_tokens - shared_tokens) // max(per_request_tokens, 1.0))
    return min(b, max_num_seqs) if max_num_seqs else b


@dataclass(frozen=True)
class Throughput:
    batch: int
    step_s: float  # a step at this batch, prefills interleaved
    requests_s: float
    output_tokens_s: float
    output_rate: float  # tokens one slot yields per step
    slot_time_s: float  # how long a request holds its slot

    def as_dict(self) -> dict:
        return asdict(self)


def throughput(model: StepModel, batch: int, kv: RequestKV, chunk: int | None) -> Throughput:
    """The design claims' throughput formula at a full batch, the step time solved with the prefill tokens it
    carries."""
    pre_steps = -(-int(round(kv.mean_uncached_in)) // chunk) if chunk else 1
    held = kv.mean_out - 1 + pre_steps  # steps a request holds its slot
    ctx = kv.mean_in + kv.mean_out / 2  # mean context of a running request
    step = decode_step_s(model, batch, ctx)
    for _ in range(50):  # fixed point: the request rate sets the prefill tokens per step, which set the step
        rate = batch / (held * step)
        pf = rate * step * kv.mean_uncached_in
        dec = batch * (kv.mean_out - 1) / held
        # a prefill token attends to about half its prompt
        step = float(model.step_s(batch, dec + pf, batch * ctx, dec * ctx + pf * kv.mean_in / 2))
    rate = batch / (held * step)
    out_rate = kv.mean_out / held
    return Throughput(batch, step, rate, batch / step * out_rate, out_rate, held * step)


def erlang_c(c: int, a: float) -> float:
    """Erlang C: the chance an arrival waits in an M/M/c queue with offered load a = lambda / mu."""
    if a >= c:
        return 1.0
    b = 1.0
    for k in range(1, c + 1):  # Erlang B by its recursion, stable for large c
        b = a * b / (k + a * b)
    rho = a / c
    return b / (1 - rho * (1 - b))


def wait_quantile_s(rate: float, c: int, service_s: float, q: float) -> float:
    """The q-quantile of the M/M/c wait: P(W > t) = C exp(-(c mu - lambda) t)."""
    mu = 1.0 / service_s
    if rate >= c * mu:
        return math.inf
    pc = erlang_c(c, rate / mu)
    return 0.0 if pc <= 1 - q else math.log(pc / (1 - q)) / (c * mu - rate)


def slo_load(tp: Throughput, ttft_slo_ms: float, q: float, prefill_alone_s: float, rel_tol: float = 1e-3) -> float:
    """The highest request rate whose q-quantile TTFT (queue + the step under way + prefill) meets the SLO."""
    fixed = prefill_alone_s + tp.step_s
    if fixed * 1e3 > ttft_slo_ms:
        return 0.0
    lo, hi = 0.0, tp.requests_s * (1 - 1e-9)
    if (wait_quantile_s(hi, tp.batch, tp.slot_time_s, q) + fixed) * 1e3 <= ttft_slo_ms:
        return hi
    while hi - lo > rel_tol * max(hi, 1e-9):
        mid = 0.5 * (lo + hi)
        ok = (wait_quantile_s(mid, tp.batch, tp.slot_time_s, q) + fixed) * 1e3 <= ttft_slo_ms
        lo, hi = (mid, hi) if ok else (lo, mid)
    return lo


def tpot_batch(model: StepModel, kv: RequestKV, tpot_slo_ms: float, limit: int) -> int:
    """The largest batch whose decode step is within a TPOT SLO (0: not even one sequence)."""
    ctx = kv.mean_in + kv.mean_out / 2
    ok = [b for b in range(1, limit + 1) if decode_step_s(model, b, ctx) * 1e3 <= tpot_slo_ms]
    return max(ok) if ok else 0


def replicas(target_rps: float, per_replica_rps: float, headroom: float) -> int | None:
    """Replicas that carry ``target_rps`` with ``headroom`` left (None: a replica carries nothing)."""
    usable = per_replica_rps * (1 - headroom)
    return math.ceil(target_rps / usable) if usable > 0 else None


def smallest_tp(weights_bytes: float, kv_bytes_per_token: float, memory_bytes: float, need_tokens: int,
                mem_util: float = 0.9) -> int | None:
    """The smallest tensor-parallel degree whose KV pool holds ``need_tokens`` next to the weights."""
    for tp in TP_DEGREES:
        if kv_pool_tokens(weights_bytes, kv_bytes_per_token, memory_bytes, tp, mem_util) >= need_tokens:
            return tp
    return None


