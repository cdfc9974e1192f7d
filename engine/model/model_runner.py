"""Turns a scheduled batch into tensors, runs the model over the paged KV cache, and moves KV blocks."""

from __future__ import annotations

import torch

from engine.model.attention import AttentionMetadata
from engine.model.decode_graphs import DecodeGraphs
from engine.model.model import CausalLM, ModelConfig, allocate_kv_cache
from engine.scheduler.block_ops import SWAP_IN, SWAP_OUT, BlockOps
from engine.scheduler.scheduler import ScheduledSeq


class ModelRunner:
    def __init__(self, model: CausalLM, model_cfg: ModelConfig, device: torch.device, dtype: torch.dtype,
                 num_blocks: int, num_host_blocks: int, block_size: int, *, max_model_len: int = 0,
                 graph_sizes: list[int] | None = None, capture_graphs: bool = False):
        self.model = model
        self.cfg = model_cfg
        self.device = device
        self.block_size = block_size
        # With decode graphs, one block past the block manager's pool: the pad rows' scratch block.
        self.kv_caches = allocate_kv_cache(model_cfg, num_blocks + (1 if graph_sizes else 0), block_size, device,
                                           dtype)
        self.decode_graphs = DecodeGraphs(
            model, self.kv_caches, scratch_block=num_blocks, block_size=block_size, max_model_len=max_model_len,
            sizes=graph_sizes, capture=capture_graphs,
        ) if graph_sizes else None
        # The host pool that swapped requests live in; pinned on CUDA so copies can overlap.
        cpu = torch.device("cpu")
        self.host_kv_caches = allocate_kv_cache(model_cfg, num_host_blocks, block_size, cpu, dtype)
        if device.type == "cuda":
            self.host_kv_caches = [(k.pin_memory(), v.pin_memory()) for k, v in self.host_kv_caches]

    # ---- block movement -------------------------------------------------------------------------
    def execute_ops(self, ops: BlockOps) -> None:
        """Swaps and copy-on-write copies in the order the scheduler asked for them (see BlockOps)."""
        for kind, pairs in ops.batches():
            a, b = self._index(pairs)
            if kind == SWAP_OUT:
                for (dk, dv), (hk, hv) in zip(self.kv_caches, self.host_kv_caches, strict=True):
                    hk[b.cpu()] = dk[a].cpu()
                    hv[b.cpu()] = dv[a].cpu()
            elif kind == SWAP_IN:
                for (dk, dv), (hk, hv) in zip(self.kv_caches, self.host_kv_caches, strict=True):
                    dk[b] = hk[a.cpu()].to(self.device)
                    dv[b] = hv[a.cpu()].to(self.device)
            else:
                for k, v in self.kv_caches:
                    k[b] = k[a]
                    v[b] = v[a]

    def _index(self, pairs: list[tuple[int, int]]) -> tuple[torch.Tensor, torch.Tensor]:
        a, b = zip(*pairs, strict=True)
        return (torch.tensor(a, dtype=torch.long, device=self.device),
                torch.tensor(b, dtype=torch.long, device=self.device))

    # ---- forward --------------------------------------------------------------------------------
    def prepare(self, batch: list[ScheduledSeq], tables: list[list[int]]
                ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        query_lens: list[int] = []
        context_lens: list[int] = []
        bs = self.block_size
        for item, table in zip(batch, tables, strict=True):
            seq, n = item.seq, item.num_new_tokens
            start = seq.num_computed
            ids += seq.token_ids[start : start + n]
            positions += range(start, start + n)
            slots += [table[p // bs] * bs + p % bs for p in range(start, start + n)]
            query_lens.append(n)
            context_lens.append(start + n)
        width = max(len(t) for t in tables)
        padded = [t + [0] * (width - len(t)) for t in tables]
        dev = self.device
        cu = [0]
        for q in query_lens:
            cu.append(cu[-1] + q)
        meta = AttentionMetadata(
            query_lens=query_lens,
            context_lens=context_lens,
            cu_query_lens=torch.tensor(cu, dtype=torch.int32, device=dev),
            context_lens_t=torch.tensor(context_lens, dtype=torch.int32, device=dev),
            block_tables=torch.tensor(padded, dtype=torch.int32, device=dev),
            slot_mapping=torch.tensor(slots, dtype=torch.long, device=dev),
        )
        return (torch.tensor(ids, dtype=torch.long, device=dev),
                torch.tensor(positions, dtype=torch.long, device=dev), meta)

    def run(self, batch: list[ScheduledSeq], tables: list[list[int]], sample_rows: list[int]) -> torch.Tensor:
        """Forward the batch; return float32 logits for the last new token of each row in sample_rows."""
        if (self.decode_graphs is not None and len(sample_rows) == len(batch)
                and all(item.num_new_tokens == 1 for item in batch)):
            logits = self.decode_graphs.run(batch, tables)  # all decodes: the static, padded path
            if logits is not None:
                return logits
        input_ids, positions, meta = self.prepare(batch, tables)
        hidden = self.model(input_ids, positions, meta, self.kv_caches)
        ends = meta.cu_query_lens.tolist()
        last = torch.tensor([ends[i + 1] - 1 for i in sample_rows], dtype=torch.long, device=self.device)
        return self.model.compute_logits(hidden[last])

