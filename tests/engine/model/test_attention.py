"""Paged attention: the torch reference against naive dense attention, and Triton against the reference."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine.model.attention import AttentionMetadata, paged_attention, write_kv


def random_batch(
    query_lens: list[int],
    context_lens: list[int],
    num_heads: int = 4,
    num_kv_heads: int = 2,
    head_dim: int = 16,
    block_size: int = 4,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
):
    """A mixed batch over a shuffled (non-contiguous) block pool, K/V written through slot_mapping.

    Returns (q, k_cache, v_cache, meta, dense) where dense[i] = (k, v) holds sequence i's full context
    [ctx, Hkv, D] in position order, for the naive check.
    """
    gen = torch.Generator().manual_seed(seed)
    blocks_per_seq = [-(-c // block_size) for c in context_lens]
    num_blocks = sum(blocks_per_seq) + 3
    perm = torch.randperm(num_blocks, generator=gen).tolist()  # scatter each sequence across the pool
    tables, cursor = [], 0
    for n in blocks_per_seq:
        tables.append(perm[cursor : cursor + n])
        cursor += n
    block_tables = torch.zeros(len(tables), max(blocks_per_seq), dtype=torch.int32)
    for i, t in enumerate(tables):
        block_tables[i, : len(t)] = torch.tensor(t)

    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=gen).to(dtype)  # garbage everywhere not written
    v_cache = torch.randn(shape, generator=gen).to(dtype)
    dense, slots = [], []
    for i, ctx in enumerate(context_lens):
        k = torch.randn(ctx, num_kv_heads, head_dim, generator=gen).to(dtype)
        v = torch.randn(ctx, num_kv_heads, head_dim, generator=gen).to(dtype)
        dense.append((k, v))
        seq_slots = torch.tensor([tables[i][p // block_size] * block_size + p % block_size for p in range(ctx)])
        write_kv(k_cache, v_cache, k, v, seq_slots)  # the cached prefix and the new tokens alike
        slots += seq_slots[ctx - query_lens[i] :].tolist()

    cu = torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()], dtype=torch.int32)
    meta = AttentionMetadata(
        query_lens=list(query_lens),
        context_lens=list(context_lens),
        cu_query_lens=cu,
        context_lens_t=torch.tensor(context_lens, dtype=torch.int32),
        block_tables=block_tables,
        slot_mapping=torch.tensor(slots, dtype=torch.int64),
    )
    q = torch.randn(sum(query_lens), num_heads, head_dim, generator=gen).to(dtype)
    return q, k_cache, v_cache, meta, dense


def naive_attention(q, dense, meta, scale):
    """Dense softmax(q k^T) v per sequence, one query at a time: obviously right, slow."""
    out = torch.empty_like(q)
    t = 0
    for (k, v), q_len, ctx in zip(dense, meta.query_lens, meta.context_lens, strict=True):
        group = q.shape[1] // k.shape[1]
        kr, vr = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)  # [ctx, Hq, D]
        for j in range(q_len):
            pos = ctx - q_len + j
            scores = torch.einsum("hd,khd->hk", q[t].double(), kr[: pos + 1].double()) * scale
            out[t] = torch.einsum("hk,khd->hd", scores.softmax(-1), vr[: pos + 1].double()).to(q.dtype)
            t += 1
    return out


CASES = {
    "prefill": ([7], [7]),
    "decode_batch": ([1, 1, 1], [5, 9, 1]),  # the vectorized path with padding and a 1-token context
    "decode_equal": ([1, 1], [8, 8]),  # the unmasked branch
    "chunk_after_prefix": ([3], [10]),
    "mixed": ([4, 1, 6, 1], [4, 13, 9, 2]),  # decodes batched, chunks looped
    "mixed_one_decode": ([5, 1], [8, 3]),  # a lone decode goes through the loop
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("heads", [(4, 4), (4, 2), (8, 1)])
def test_paged_reference_matches_naive(case, heads):
    query_lens, context_lens = CASES[case]
    q, k_cache, v_cache, meta, dense = random_batch(query_lens, context_lens, *heads)
    scale = 0.3
    got = paged_attention(q, k_cache, v_cache, meta, scale)
    torch.testing.assert_close(got, naive_attention(q, dense, meta, scale), atol=1e-5, rtol=1e-5)


def test_decode_path_agrees_with_per_sequence_path():
    # Same decodes computed batched and as one-sequence batches (which takes the same vectorized path
    # with no padding): padding must not leak into any sequence.
    q, k_cache, v_cache, meta, _ = random_batch([1, 1, 1], [3, 17, 6], block_size=8)
    batched = paged_attention(q, k_cache, v_cache, meta, 0.25)
    for i in range(3):
        one = AttentionMetadata(
            [1], [meta.context_lens[i]], torch.tensor([0, 1], dtype=torch.int32),
            meta.context_lens_t[i : i + 1], meta.block_tables[i : i + 1], meta.slot_mapping[i : i + 1],
        )  # fmt: skip
        torch.testing.assert_close(batched[i : i + 1], paged_attention(q[i : i + 1], k_cache, v_cache, one, 0.25))


def test_write_kv_places_tokens_at_slots():
    k_cache = torch.zeros(3, 4, 2, 8)
    v_cache = torch.zeros(3, 4, 2, 8)
    k, v = torch.rand(2, 2, 8) + 1, torch.rand(2, 2, 8) + 1  # no zeros, so nonzero counts are exact
    write_kv(k_cache, v_cache, k, v, torch.tensor([9, 2]))  # block 2 offset 1, block 0 offset 2
    torch.testing.assert_close(k_cache[2, 1], k[0])
    torch.testing.assert_close(v_cache[0, 2], v[1])
    assert k_cache.count_nonzero() == k.numel()  # nothing else was touched


# Triton, through its CPU interpreter. TRITON_INTERPRET must be set before triton is imported, and other
# tests in this process may import it first, so the comparison runs in a fresh interpreter.
TRITON_CHECK = """
import torch
from engine.model.attention import paged_attention
from engine.model.triton_attention import triton_paged_attention
from tests.engine.model.test_attention import random_batch

cases = [
    # (query_lens, context_lens, num_heads, num_kv_heads, head_dim, block_size)
    ([1, 1, 1], [5, 40, 1], 4, 2, 16, 4),       # decode, GQA 2
    ([1, 1], [70, 33], 8, 1, 32, 16),           # decode, MQA: 8 rows in one tile, >1 key tile
    ([9], [9], 4, 4, 16, 8),                    # plain prefill
    ([5, 1, 20, 1], [12, 7, 20, 66], 4, 2, 24, 4),  # mixed, chunk after prefix, head_dim not a power of 2
]
for i, (ql, cl, hq, hkv, d, bs) in enumerate(cases):
    q, kc, vc, meta, _ = random_batch(ql, cl, hq, hkv, d, bs, seed=i)
    ref = paged_attention(q, kc, vc, meta, d ** -0.5)
    got = triton_paged_attention(q, kc, vc, meta, d ** -0.5)
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4, msg=lambda m, i=i: f"case {i}: {m}")
print("triton ok", len(cases))
"""


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
def test_triton_matches_reference_interpreted():
    root = Path(__file__).resolve().parents[3]
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(root)}
    proc = subprocess.run(
        [sys.executable, "-c", TRITON_CHECK], cwd=root, env=env, capture_output=True, text=True, timeout=240
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "triton ok 4" in proc.stdout
