"""Attention metadata for one mixed batch (prefill chunks + decodes) over the paged KV cache.

Torch reference kernels live here too (written by the model work); Triton ones in triton_attention.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


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
