"""Triton paged attention for mixed prefill + decode batches, the CUDA counterpart of
`engine.model.attention.paged_attention` (same signature, same result).

Only imported on CUDA (see loader.default_attention_fn), so CPU-only installs never need triton.

One program handles one (sequence, KV head, block of query rows). Rows are (new token, query head in the
KV head's group) pairs, so a decode step packs its whole GQA group into one tile and each K/V page is read
once per group instead of once per query head. K/V are read page by page through the block table with an
online softmax (flash-attention style), and the causal limit of each row is its token's position.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.model.attention import AttentionMetadata


@triton.jit
def _paged_attention_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, out_ptr,
    cu_query_lens_ptr, context_lens_ptr, block_tables_ptr,
    scale_log2,
    stride_qt, stride_qh, stride_ot, stride_oh,
    stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
    stride_bt,
    GROUP: tl.constexpr, PAGE_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    m_block = tl.program_id(2)

    q_start = tl.load(cu_query_lens_ptr + seq)
    q_len = tl.load(cu_query_lens_ptr + seq + 1) - q_start
    ctx_len = tl.load(context_lens_ptr + seq)

    rows = m_block * BLOCK_M + tl.arange(0, BLOCK_M)
    tok = rows // GROUP
    head = kv_head * GROUP + rows % GROUP
    row_ok = tok < q_len
    q_pos = ctx_len - q_len + tok  # position of each row's token; it sees keys 0..q_pos
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM

    q_offs = (q_start + tok)[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :]
    q = tl.load(q_ptr + q_offs, mask=row_ok[:, None] & d_ok[None, :], other=0.0)

    # Keys this tile needs end at its last valid token; a tile past the sequence's rows needs none.
    first_tok = (m_block * BLOCK_M) // GROUP
    last_tok = tl.minimum((m_block * BLOCK_M + BLOCK_M - 1) // GROUP, q_len - 1)
    kv_end = tl.where(first_tok < q_len, ctx_len - q_len + last_tok + 1, 0)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    for start in range(0, kv_end, BLOCK_N):
        kn = start + tl.arange(0, BLOCK_N)
        kn_ok = kn < kv_end
        block = tl.load(block_tables_ptr + seq * stride_bt + kn // PAGE_SIZE, mask=kn_ok, other=0).to(tl.int64)
        in_page = kn % PAGE_SIZE
        kv_mask = kn_ok[:, None] & d_ok[None, :]
        k_offs = block[:, None] * stride_kb + in_page[:, None] * stride_ks + kv_head * stride_kh + d[None, :]
        v_offs = block[:, None] * stride_vb + in_page[:, None] * stride_vs + kv_head * stride_vh + d[None, :]
        k = tl.load(k_cache_ptr + k_offs, mask=kv_mask, other=0.0)
        v = tl.load(v_cache_ptr + v_offs, mask=kv_mask, other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale_log2  # [M, N], log2 domain
        s = tl.where((kn[None, :] <= q_pos[:, None]) & kn_ok[None, :], s, float("-inf"))
        # Key 0 is in every row's first tile, so m_new is finite from the first iteration on.
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new

    out = acc / l_i[:, None]
    o_offs = (q_start + tok)[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :]
    tl.store(out_ptr + o_offs, out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])


def triton_paged_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata, scale: float
) -> torch.Tensor:
    """q [T, Hq, D] -> [T, Hq, D]; the new tokens' K/V must already be in the cache (see write_kv)."""
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    group = num_heads // num_kv_heads
    out = torch.empty_like(q)
    if meta.num_seqs == 0:
        return out
    q = q if q.stride(-1) == 1 else q.contiguous()
    rows = max(meta.query_lens) * group
    block_m = 16 if rows <= 16 else 64  # tl.dot needs >= 16; decode tiles stay small
    block_d = max(16, triton.next_power_of_2(head_dim))
    grid = (meta.num_seqs, num_kv_heads, triton.cdiv(rows, block_m))
    _paged_attention_kernel[grid](
        q, k_cache, v_cache, out,
        meta.cu_query_lens, meta.context_lens_t, meta.block_tables,
        scale * 1.4426950408889634,  # log2(e): the kernel uses exp2
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        meta.block_tables.stride(0),
        GROUP=group, PAGE_SIZE=k_cache.shape[1], HEAD_DIM=head_dim, BLOCK_D=block_d,
        BLOCK_M=block_m, BLOCK_N=64 if block_m == 64 else 32,
        # fp32 stays exact (tests, reference checks); half types use the tensor cores.
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
    )  # fmt: skip
    return out
