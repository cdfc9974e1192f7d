"""Premium's reservation: a share of the KV blocks and of the batch slots that only premium requests may use.

The other tiers together hold at most what the reservation leaves them (`kv_limit`, `slot_limit`). The scheduler
asks `within_share` before a non-premium request takes fresh KV blocks and has its blocks counted (`note_blocks`)
once it holds them; a block several of them share counts once.
"""

from __future__ import annotations

from engine.request.config import EngineConfig
from engine.request.sequence import Request, Sequence
from engine.scheduler.block_manager import BlockManager


class PremiumReservation:
    def __init__(self, config: EngineConfig, block_manager: BlockManager):
        self.config = config
        self.bm = block_manager
        self.reserved_blocks = int(config.premium_reserved_kv_frac * block_manager.num_blocks)
        self.limited_blocks: set[int] = set()  # blocks the non-premium running requests reference

    def slot_limit(self, tier: str) -> int:
        """Batch slots the tier may hold (with the other non-premium tiers)."""
        reserved = 0 if tier == "premium" else self.config.premium_reserved_slots
        return self.config.max_num_seqs - reserved

    def kv_limit(self, tier: str) -> int:
        """KV blocks the tier may hold (with the other non-premium tiers)."""
        return self.bm.num_blocks - (0 if tier == "premium" else self.reserved_blocks)

    def limits(self, request: Request) -> bool:
        """Whether the request's KV counts against the non-premium share."""
        return self.reserved_blocks > 0 and request.tier != "premium"

    def within_share(self, request: Request, blocks: int) -> bool:
        """`blocks` more blocks keep the request's tier within its share."""
        return not self.limits(request) or len(self.limited_blocks) + blocks <= self.kv_limit(request.tier)

    def uncounted_blocks(self, request: Request, seq: Sequence) -> int:
        """The sequence's blocks (a cached prefix it found) not yet counted against the share."""
        return len(set(self.bm.tables[seq.seq_id]) - self.limited_blocks) if self.limits(request) else 0

    def note_blocks(self, request: Request, seq: Sequence) -> None:
        if self.limits(request):
            self.limited_blocks.update(self.bm.tables.get(seq.seq_id, ()))

    def recount(self, running: list[Request]) -> None:
        """Count the limited blocks afresh: a preemption or a copy-on-write may have left one counted that no
        longer is."""
        if self.reserved_blocks:
            self.limited_blocks = self._held_below_premium(running)

    def check_integrity(self, running: list[Request]) -> None:
        if self.reserved_blocks:
            held = self._held_below_premium(running)
            assert len(held) <= self.kv_limit("standard"), (
                f"non-premium requests hold {len(held)} KV blocks, more than the "
                f"{self.kv_limit('standard')} the premium reservation leaves them")

    def _held_below_premium(self, running: list[Request]) -> set[int]:
        tables = self.bm.tables
        return {b for r in running if r.tier != "premium" for s in r.seqs for b in tables.get(s.seq_id, ())}
