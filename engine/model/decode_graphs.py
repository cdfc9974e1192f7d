"""Decode steps on static, padded buffers, replayed from CUDA graphs on a GPU.

A decode step of a small model on a GPU is a few hundred kernel launches of microseconds each: launching
them from Python takes longer than running them. A CUDA graph records one step's launches once per batch
size and replays them with one call. That needs every tensor the step touches at a fixed address and shape,
so the step reads its inputs from buffers allocated once (token ids, positions, KV slots, context lengths,
block tables as wide as the longest sequence can need), and a batch of n sequences runs as the smallest
captured size >= n, its extra rows padded: token 0 at position 0, attending to one token of a scratch KV
block that no sequence owns, written to that block's first slot. The pad rows' logits are dropped.

Capture needs the Triton attention kernel (its grid depends only on the batch size; the torch reference
sizes its gather from the host's context lengths), so `auto` captures on CUDA with Triton and runs the
ordinary path elsewhere. `eager` runs the same padded path without capturing, on any device: what the
tests check on the CPU against the ordinary path.
"""

from __future__ import annotations

import bisect
import math

import torch

from engine.model.attention import AttentionMetadata, paged_attention
from engine.model.model import CausalLM, KVCache
from engine.scheduler.scheduler import ScheduledSeq


def graph_batch_sizes(max_num_seqs: int) -> list[int]:
    """1, 2, 4, then every multiple of 8 up to max_num_seqs (and max_num_seqs itself), as vLLM captures."""
    sizes = {s for s in (1, 2, 4) if s <= max_num_seqs} | set(range(8, max_num_seqs + 1, 8)) | {max_num_seqs}
    return sorted(sizes)


def decode_graph_plan(mode: str, device_type: str, model: CausalLM, max_num_seqs: int
                      ) -> tuple[list[int] | None, bool]:
    """(batch sizes for the padded path or None, whether to capture them) for `EngineConfig.decode_graphs`."""
    if mode == "eager":
        return graph_batch_sizes(max_num_seqs), False
    if mode == "auto" and device_type == "cuda" and model.attention_fn is not paged_attention:
        return graph_batch_sizes(max_num_seqs), True
    return None, False


class DecodeGraphs:
    """The padded decode path: `run(batch, tables)` returns the batch's logits, or None if it does not fit.

    `scratch_block` is a KV block outside the block manager's pool (the runner allocates one extra).
    """

    def __init__(self, model: CausalLM, kv_caches: list[KVCache], *, scratch_block: int, block_size: int,
                 max_model_len: int, sizes: list[int], capture: bool):
        self.model = model
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.scratch_block = scratch_block
        self.sizes = sorted(sizes)
        self.captured = capture
        device = kv_caches[0][0].device
        n = self.sizes[-1]
        self.width = math.ceil(max_model_len / block_size)  # block-table entries the longest sequence needs
        self.input_ids = torch.zeros(n, dtype=torch.long, device=device)
        self.positions = torch.zeros(n, dtype=torch.long, device=device)
        self.slots = torch.full((n,), scratch_block * block_size, dtype=torch.long, device=device)
        self.context_lens = torch.ones(n, dtype=torch.int32, device=device)
        self.block_tables = torch.full((n, self.width), scratch_block, dtype=torch.int32, device=device)
        self.cu_query_lens = torch.arange(n + 1, dtype=torch.int32, device=device)  # one new token per row
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        if capture:
            self._capture_all()

    def size_for(self, num_seqs: int) -> int | None:
        """The smallest size that holds num_seqs rows; None past the largest."""
        i = bisect.bisect_left(self.sizes, num_seqs)
        return self.sizes[i] if i < len(self.sizes) else None

    def run(self, batch: list[ScheduledSeq], tables: list[list[int]]) -> torch.Tensor | None:
        """Float32 logits [len(batch), vocab] for a batch of decodes (valid until the next run)."""
        size = self.size_for(len(batch))
        if size is None:
            return None
        context_lens = self._fill(batch, tables, size)
        if self.captured:
            graph, logits = self.graphs[size]
            graph.replay()
        else:
            logits = self._forward(size, self._meta(size, context_lens))
        return logits[: len(batch)]

    # ---- the static buffers ---------------------------------------------------------------------
    def _fill(self, batch: list[ScheduledSeq], tables: list[list[int]], size: int) -> list[int]:
        """The batch's rows into the buffers, pad rows after them; returns every row's context length."""
        n, bs, scratch = len(batch), self.block_size, self.scratch_block
        ids, positions, slots, context = [], [], [], []
        for item, table in zip(batch, tables, strict=True):
            pos = item.seq.num_computed  # the one new token's position
            ids.append(item.seq.token_ids[pos])
            positions.append(pos)
            slots.append(table[pos // bs] * bs + pos % bs)
            context.append(pos + 1)
        pad = size - n
        ids += [0] * pad
        positions += [0] * pad
        slots += [scratch * bs] * pad
        context += [1] * pad
        used = max(len(t) for t in tables)  # entries past a row's context are never read: no need to clear
        if used > self.width:
            raise ValueError(f"a block table of {used} blocks is wider than the buffers' {self.width}")
        rows = [t + [scratch] * (used - len(t)) for t in tables] + [[scratch] * used] * pad
        device = self.input_ids.device
        self.input_ids[:size].copy_(torch.tensor(ids, dtype=torch.long), non_blocking=device.type == "cuda")
        self.positions[:size].copy_(torch.tensor(positions, dtype=torch.long))
        self.slots[:size].copy_(torch.tensor(slots, dtype=torch.long))
        self.context_lens[:size].copy_(torch.tensor(context, dtype=torch.int32))
        self.block_tables[:size, :used].copy_(torch.tensor(rows, dtype=torch.int32))
        return context

    def _meta(self, size: int, context_lens: list[int]) -> AttentionMetadata:
        return AttentionMetadata(
            query_lens=[1] * size, context_lens=context_lens, cu_query_lens=self.cu_query_lens[: size + 1],
            context_lens_t=self.context_lens[:size], block_tables=self.block_tables[:size],
            slot_mapping=self.slots[:size],
        )

    def _forward(self, size: int, meta: AttentionMetadata) -> torch.Tensor:
        hidden = self.model(self.input_ids[:size], self.positions[:size], meta, self.kv_caches)
        return self.model.compute_logits(hidden)

    # ---- capture --------------------------------------------------------------------------------
    def _capture_all(self) -> None:
        """One graph per size, largest first, in one memory pool (a smaller graph reuses the larger's memory).

        The buffers hold pad rows while capturing: every row attends to the scratch block only.
        """
        pool = torch.cuda.graph_pool_handle()
        side = torch.cuda.Stream()
        for size in reversed(self.sizes):
            meta = self._meta(size, [1] * size)
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # warm-up outside the capture: Triton compiles, allocators settle
                for _ in range(2):
                    self._forward(size, meta)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                logits = self._forward(size, meta)
            self.graphs[size] = (graph, logits)
        torch.cuda.synchronize()
