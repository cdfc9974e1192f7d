"""Attention metadata for one mixed batch (prefill chunks + decodes) over the paged KV cache.

Torch reference kernels live here too (written by the model work); Triton ones in triton_attention.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class AttentionMetadata:
    """Describes a flattened batch: the new tokens of every sequence, concatenated.

    Sequence i contributes query_lens[i] new tokens (a prefill chunk, or 1 for a decode). After their K/V
    are written, the sequence holds context_lens[i] tokens in the cache: the new tokens are the last
    query_lens[i] of them, so new token j of sequence i sits at position context_lens[i] - query_lens[i] + j
    and attends causally to every cached token before it.
    """

    query_lens: list[int]  # host-side copies avoid device syncs in the loop over sequences
    context_lens: list[int]
    cu_query_lens: torch.Tensor  # int32 [B + 1], on the model's device
    context_lens_t: torch.Tensor  # int32 [B]
    block_tables: torch.Tensor  # int32 [B, max_blocks], padded with 0
    slot_mapping: torch.Tensor  # int64 [T]: block_id * block_size + offset for each new token

    @property
    def num_seqs(self) -> int:
        return len(self.query_lens)

    @property
    def is_all_decode(self) -> bool:
        return all(q == 1 for q in self.query_lens)


def write_kv(
    k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Store the new tokens' K/V ([T, Hkv, D]) at their slots in the paged caches ([blocks, bs, Hkv, D])."""
    num_kv_heads, head_dim = k_cache.shape[-2:]
    k_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, k.to(k_cache.dtype))
    v_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, v.to(v_cache.dtype))


# Reused gather buffers for the CPU path, keyed by (slot, dtype). A fresh multi-MB tensor per layer costs
# more in page faults (glibc hands large blocks straight back to the OS) than the gather itself: 4x slower
# decode at batch 64. The engine runs one forward at a time, so one buffer per slot is enough.
_cpu_workspace: dict[tuple[str, torch.dtype], torch.Tensor] = {}


def gather_kv(
    cache: torch.Tensor, block_tables: torch.Tensor, num_tokens: int, slot: str | None = None
) -> torch.Tensor:
    """Read the first num_tokens cached tokens of each sequence: [B, num_tokens, Hkv, D] (rows are padded).

    With `slot` on CPU the result lives in a reused buffer, valid until the next gather into that slot.
    """
    num_seqs = block_tables.shape[0]
    num_blocks_total, block_size = cache.shape[:2]
    num_blocks = -(-num_tokens // block_size)
    ids = block_tables[:, :num_blocks].reshape(-1).long()
    flat = cache.view(num_blocks_total, -1)
    out = None
    if slot is not None and cache.device.type == "cpu":
        numel = ids.numel() * flat.shape[1]
        buf = _cpu_workspace.get((slot, cache.dtype))
        if buf is None or buf.numel() < numel:
            with torch.inference_mode(False):  # a normal tensor is writable both in and out of inference mode
                buf = _cpu_workspace[(slot, cache.dtype)] = torch.empty(numel, dtype=cache.dtype)
        out = buf[:numel].view(ids.numel(), flat.shape[1])
    pages = torch.index_select(flat, 0, ids, out=out) if out is not None else flat.index_select(0, ids)
    return pages.view(num_seqs, num_blocks * block_size, *cache.shape[2:])[:, :num_tokens]


def paged_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata, scale: float
) -> torch.Tensor:
    """Torch reference: q [T, Hq, D] for the batch's new tokens -> [T, Hq, D].

    K/V are read from the caches through the block tables (the new tokens' K/V must already be written),
    so a prefill chunk after a cached prefix and a decode are the same computation. GQA is handled by
    folding the Hq / Hkv query heads that share a KV head into the query-length axis, which keeps K/V
    un-repeated. Single-token rows (decodes) of a mixed batch take one batched call; only the prefill
    chunks loop, so a step with one chunk and 63 decodes costs two attention calls per layer, not 64.
    """
    if meta.num_seqs == 0:
        return q
    if meta.is_all_decode:
        return _decode_attention(q, k_cache, v_cache, meta.context_lens, meta.context_lens_t, meta.block_tables, scale)
    out = torch.empty_like(q)
    starts = [0]
    for n in meta.query_lens:
        starts.append(starts[-1] + n)
    single = [i for i, n in enumerate(meta.query_lens) if n == 1]
    if len(single) > 1:
        rows = torch.tensor([starts[i] for i in single], device=q.device)
        seqs = torch.tensor(single, device=q.device)
        out[rows] = _decode_attention(
            q[rows], k_cache, v_cache, [meta.context_lens[i] for i in single],
            meta.context_lens_t[seqs], meta.block_tables[seqs], scale,
        )  # fmt: skip
    else:
        single = []
    for i, (q_len, ctx_len) in enumerate(zip(meta.query_lens, meta.context_lens, strict=True)):
        if q_len > 0 and (q_len > 1 or not single):
            start = starts[i]
            out[start : start + q_len] = _prefill_one(
                q[start : start + q_len], k_cache, v_cache, meta.block_tables[i : i + 1], ctx_len, scale
            )
    return out


def _decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    context_lens: list[int],
    context_lens_t: torch.Tensor,
    block_tables: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    # One query per sequence: gather every sequence's context padded to the longest and mask the padding,
    # so the whole batch is one SDPA call instead of B small ones.
    num_seqs, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    group = num_heads // num_kv_heads
    max_len = max(context_lens)
    k = gather_kv(k_cache, block_tables, max_len, "k").transpose(1, 2)  # [B, Hkv, L, D]
    v = gather_kv(v_cache, block_tables, max_len, "v").transpose(1, 2)
    qg = q.view(num_seqs, num_kv_heads, group, head_dim).to(k.dtype)
    if min(context_lens) == max_len:
        mask = None
    else:
        positions = torch.arange(max_len, device=q.device)
        mask = (positions[None, :] < context_lens_t[:, None]).view(num_seqs, 1, 1, max_len)
    out = F.scaled_dot_product_attention(qg, k, v, attn_mask=mask, scale=scale)
    return out.reshape(num_seqs, num_heads, head_dim).to(q.dtype)


def _prefill_one(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    ctx_len: int,
    scale: float,
) -> torch.Tensor:
    """One sequence's q_len new tokens [q_len, Hq, D] against its ctx_len cached tokens."""
    q_len, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    group = num_heads // num_kv_heads
    k = gather_kv(k_cache, block_table, ctx_len, "k")[0].transpose(0, 1)  # [Hkv, L, D]
    v = gather_kv(v_cache, block_table, ctx_len, "v")[0].transpose(0, 1)
    if q_len == ctx_len:
        return _causal_prefill(q, k, v, group, scale)
    # [q_len, Hq, D] -> [Hkv, group * q_len, D]: rows ordered (group member, token).
    qi = q.view(q_len, num_kv_heads, group, head_dim).permute(1, 2, 0, 3)
    qi = qi.reshape(num_kv_heads, group * q_len, head_dim).to(k.dtype)
    # New token j sits at position ctx_len - q_len + j and sees keys up to and including itself.
    q_pos = torch.arange(ctx_len - q_len, ctx_len, device=q.device)
    mask = torch.arange(ctx_len, device=q.device)[None, :] <= q_pos[:, None]  # [q_len, L]
    # Four-dimensional operands: torch's CPU flash kernel takes them (three-dimensional ones fell back to the
    # unfused math path, ~3x slower for a 160-token chunk).
    o = F.scaled_dot_product_attention(qi[None], k[None], v[None], attn_mask=mask.repeat(group, 1)[None, None],
                                       scale=scale)[0]
    return o.view(num_kv_heads, group, q_len, head_dim).permute(2, 0, 1, 3).flatten(1, 2).to(q.dtype)


def _causal_prefill(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: int, scale: float) -> torch.Tensor:
    """A prefill with nothing cached before it ([L, Hq, D] against k, v [Hkv, L, D]): plain causal attention.

    is_causal lets the fused kernel skip the upper triangle; an explicit [group * L, L] mask made it build and
    compute the whole square (one `tiny` layer's 4096-token prefill: 550 ms vs 150 ms on the 2-core CPU,
    same result), so an unchunked prefill looked slow for a reason that has nothing to do with chunking. The
    query heads sharing a KV head see it through an expanded view (no copy); enable_gqa would do the same but
    needs torch >= 2.5.
    """
    q_len, _, head_dim = q.shape
    num_kv_heads = k.shape[0]
    qi = q.view(q_len, num_kv_heads, group, head_dim).permute(1, 2, 0, 3).to(k.dtype)  # [Hkv, group, L, D]
    shape = (num_kv_heads, group, q_len, head_dim)
    o = F.scaled_dot_product_attention(qi, k[:, None].expand(shape), v[:, None].expand(shape), is_causal=True,
                                       scale=scale)
    return o.permute(2, 0, 1, 3).flatten(1, 2).to(q.dtype)
