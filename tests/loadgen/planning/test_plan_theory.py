"""The planner's formulas on hand-computed examples: a Llama-3-8B-shaped model (32 layers, hidden 4096, 32
heads, 8 KV heads, head 128, intermediate 14336, vocab 128256, bf16, untied embeddings) on the H100 profile."""

from __future__ import annotations

import math

import numpy as np
import pytest

from loadgen.planning import hardware, theory
from loadgen.planning.model_shape import ModelShape, from_sizes
from loadgen.planning.requests import Requests
from loadgen.planning.step_model import Roofline, decode_step_s

LLAMA3_8B = ModelShape(layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128, intermediate=14336,
                       vocab=128256, tied=False, dtype_bytes=2, name="llama-3-8b")


def test_weights_and_kv_per_token():
    # per layer: q and o 2 x 4096 x 4096 = 33,554,432; k and v 2 x 4096 x 1024 = 8,388,608;
    # SwiGLU 3 x 4096 x 14336 = 176,160,768; two norms 8,192 -> 218,112,000; x 32 = 6,979,584,000
    # embeddings in and out 2 x 128256 x 4096 = 1,050,673,152; final norm 4,096
    assert LLAMA3_8B.params == 8_030_261_248
    assert LLAMA3_8B.weights_bytes == 16_060_522_496
    assert LLAMA3_8B.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2 == 131072


def test_explicit_sizes_give_the_same_shape():
    shape = from_sizes("layers=32,hidden=4096,heads=32,kv_heads=8,intermediate=14336,vocab=128256")
    assert shape.params == LLAMA3_8B.params and shape.head_dim == 128
    with pytest.raises(ValueError, match="lack"):
        from_sizes("layers=32,hidden=4096")


def test_kv_pool_and_max_batch_on_h100():
    h100 = hardware.lookup("h100")
    # 0.9 x 80e9 - 16,060,522,496 = 55,939,477,504 bytes free / 131,072 per token = 426,784 tokens
    pool = theory.kv_pool_tokens(LLAMA3_8B.weights_bytes, LLAMA3_8B.kv_bytes_per_token, h100.memory_bytes, 1, 0.9)
    assert pool == 426_784
    assert theory.max_batch(pool, 4096, 0, None) == 104  # 4,096-token contexts: 426,784 // 4,096
    assert theory.max_batch(pool, 4096, 0, 64) == 64  # the slot limit binds first
    # twice the devices: 2 x 72e9 - the weights once = 127,939,477,504 bytes / 131,072 = 976,100 tokens
    assert theory.kv_pool_tokens(LLAMA3_8B.weights_bytes, 131072, h100.memory_bytes, 2, 0.9) == 976_100


def test_paged_kv_over_a_requests_life_with_a_shared_prompt():
    # prompt 100 tokens (64 of them a shared system prompt: 4 full blocks of 16), answer 29 tokens: it holds
    # tokens 100..128 over its 29 steps: ceil(t / 16) = 7 blocks for 100..112 (13 steps), 8 for 113..128 (16)
    n = 4
    req = Requests(np.zeros(n), np.full(n, 100), np.full(n, 29), np.asarray(["none"] * n),
                   prefix=np.asarray([0, 0, 1, -1]), prefix_len=np.asarray([64, 64, 64, 0]))
    kv = theory.request_kv(req, 16, prefix_caching=True)
    mean_blocks = (13 * 7 + 16 * 8) / 29
    assert kv.mean_tokens == pytest.approx(16 * (mean_blocks - 4 * 3 / 4))
    assert kv.peak_tokens == pytest.approx(16 * (8 - 3))
    assert kv.shared_tokens == 2 * 64  # two distinct prompts, held once each
    assert kv.max_peak_tokens == 128
    no_cache = theory.request_kv(req, 16, prefix_caching=False)
    assert no_cache.mean_tokens == pytest.approx(16 * mean_blocks) and no_cache.shared_tokens == 0


def test_blocks_sum_closed_form():
    for b in (1, 7, 16):
        for x in range(0, 70):
            assert theory.blocks_sum(x, b) == sum(math.ceil(y / b) for y in range(1, x + 1))


def test_roofline_step_is_memory_bound_at_small_batch_and_compute_bound_at_large():
    h100 = hardware.lookup("H100")
    model = Roofline(LLAMA3_8B, h100, tp=1, overhead_s=0.0)
    # batch 1, no context: the weights once and the new token's KV over the bandwidth
    assert decode_step_s(model, 1, 0) == pytest.approx((16_060_522_496 + 131_072) / 3.35e12)
    # a 4,096-token prefill step: 4,096 x 2 x 7,504,924,672 matmul FLOPs (+ attention) over 989e12
    flops = 4096 * LLAMA3_8B.matmul_flops_per_token + LLAMA3_8B.attention_flops_per_pair * 4096 * 4097 / 2
    assert float(model.step_s(1, 4096, 4096, 4096 * 4097 / 2)) == pytest.approx(flops / 989e12)
    assert LLAMA3_8B.matmul_flops_per_token == 2 * (32 * (218_112_000 - 8192) + 128256 * 4096)
    # tensor parallel over 2 devices halves the memory-bound step
    tp2 = Roofline(LLAMA3_8B, h100, tp=2)
    assert decode_step_s(tp2, 1, 0) == pytest.approx((16_060_522_496 + 131_072) / 3.35e12 / 2)


def test_queueing_and_replicas():
    assert theory.erlang_c(1, 0.5) == pytest.approx(0.5)  # M/M/1: P(wait) = rho
    assert theory.erlang_c(2, 1.0) == pytest.approx(1 / 3)  # M/M/2 at rho 0.5
    # M/M/1, mu = 1, lambda = 0.5: P(W > t) = 0.5 exp(-0.5 t); the 99th percentile is 2 ln 50
    assert theory.wait_quantile_s(0.5, 1, 1.0, 0.99) == pytest.approx(2 * math.log(50))
    assert theory.wait_quantile_s(1.0, 1, 1.0, 0.99) == math.inf
    assert theory.replicas(100, 30, 0.2) == 5  # 100 / (30 x 0.8) = 4.17
    assert theory.replicas(100, 0, 0.2) is None
    # Llama-3-8B in bf16 fits one 24 GB L4 at 0.9 with 16k tokens of KV? 21.6e9 - 16.06e9 = 5.54e9 / 131072
    l4 = hardware.lookup("L4")
    assert theory.smallest_tp(LLAMA3_8B.weights_bytes, 131072, l4.memory_bytes, 16384) == 1
    assert theory.smallest_tp(LLAMA3_8B.weights_bytes, 131072, l4.memory_bytes, 100_000) == 2


def test_every_accelerator_has_its_spec_sheet_figures():
    names = {a.name for a in hardware.ACCELERATORS.values()}
    assert names == {"H100", "H200", "B200", "A100-80GB", "L40S", "L4", "MI300X"}
    assert hardware.lookup("h200").bandwidth_bytes_s == 4.8e12
    with pytest.raises(KeyError, match="unknown hardware"):
        hardware.lookup("tpu")


def test_a_long_prompts_probe_point_sums_its_chunks_steps():
    """A prompt longer than the prefill chunk is several steps, each chunk attending to what came before:
    1,024 tokens in 256-token chunks are 4 steps, 1,024 new tokens and sum 256 x (256 k + 128.5) pairs."""
    from loadgen.planning.step_timing import prefill_features

    assert prefill_features(1024, 256) == (4.0, 4.0, 1024.0, 256 * sum(256 * k + 128.5 for k in range(4)))
    assert prefill_features(100, 256) == prefill_features(100, None) == (1.0, 1.0, 100.0, 100 * 101 / 2)
    assert prefill_features(300, 256) == (2.0, 2.0, 300.0, 256 * 128.5 + 44 * (256 + 22.5))


def test_the_longest_length_a_distribution_draws():
    from loadgen.workload.synthetic import LengthDist

    assert LengthDist("empirical", values=[48, 1024, 96]).longest == 1024  # not the unbounded default max
    assert LengthDist("fixed", value=128).longest == 128
    assert LengthDist("uniform", min=24, max=96).longest == 96
    assert LengthDist("lognormal", mean=96, sigma=0.5, max=512).longest == 397  # its 99.9th percentile
    assert LengthDist("lognormal", mean=96, sigma=0.5, max=300).longest == 300
    assert LengthDist("normal", mean=100, std=10).longest == 131
