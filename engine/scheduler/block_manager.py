"""Paged KV cache bookkeeping: a block pool with reference counts, prefix caching, copy-on-write, swapping.

Only ids and counts live here; the model runner moves the actual K/V (copies and swaps this module asks for).

- A sequence's block table maps its token positions to fixed-size blocks, allocated on demand.
- Full blocks get a hash chained over (parent hash, token ids); a later sequence whose prompt starts with
  the same tokens takes references on those blocks instead of recomputing them (prefix sharing).
- A freed block that carries a hash stays cached (evictable, least recently used first) until its id is
  needed again; a freed block without one goes straight back to the free list.
- Writing into a block that another sequence also references (after `fork`, as n > 1 sampling does)
  first copies it (copy-on-write).
- A whole group of sequences can be swapped to a host pool and back.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict, deque
from dataclasses import dataclass

from engine.scheduler.block_ops import COPY, SWAP_IN, SWAP_OUT, BlockOps


def kv_slots(prompt_len: int, max_tokens: int) -> int:
    """KV slots one sequence ever writes: every token but the last one sampled."""
    return prompt_len + max_tokens - 1


def kv_blocks_alone(prompt_len: int, n: int, max_tokens: int, block_size: int) -> int:
    """KV blocks a request may hold at its largest: the prompt's full blocks shared by its n sequences, and
    each sequence's own blocks for the rest of its KV slots (copy-on-write and contiguous reservation
    included)."""
    shared = prompt_len // block_size
    return shared + n * (-(-kv_slots(prompt_len, max_tokens) // block_size) - shared)


class NoFreeBlocksError(RuntimeError):
    pass


_NO_OPS = BlockOps()  # returned when nothing moves; never mutated (callers extend their own)


@dataclass
class KVStats:
    num_blocks: int
    used_blocks: int  # referenced by at least one sequence
    cached_blocks: int  # unreferenced but still holding a reusable prefix
    free_blocks: int
    usage: float  # used / total (cached blocks count as free: they can be taken at any time)
    fragmentation: float  # allocated but unfilled slots / allocated slots, over used blocks
    blocks_saved_by_sharing: int  # references beyond the first, i.e. blocks sharing saved
    host_blocks: int
    host_used_blocks: int
    prefix_query_tokens: int
    prefix_hit_tokens: int


def chain_hash(parent: bytes | None, tokens: list[int] | tuple[int, ...]) -> bytes:
    """sha256 over the parent block's hash and this block's token ids (vLLM's choice: Python's hash() of
    a tuple collides, and a collision would hand a request another prompt's KV)."""
    h = hashlib.sha256(parent or b"")
    h.update(array("q", tokens).tobytes())
    return h.digest()


class BlockManager:
    def __init__(
        self, num_blocks: int, block_size: int, num_host_blocks: int = 0, enable_prefix_caching: bool = True
    ):
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError("num_blocks and block_size must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.num_host_blocks = num_host_blocks
        self.enable_prefix_caching = enable_prefix_caching

        self.ref_count = [0] * num_blocks
        self.block_hash: list[bytes | None] = [None] * num_blocks
        # What a cached block holds, (parent hash, token ids): a hit compares it, never trusting the hash alone.
        self.block_key: list[tuple[bytes | None, tuple[int, ...]] | None] = [None] * num_blocks
        self.hash_to_block: dict[bytes, int] = {}
        self.free_ids: deque[int] = deque(range(num_blocks))
        self.evictable: OrderedDict[int, None] = OrderedDict()  # unreferenced cached blocks, LRU first

        self.tables: dict[int, list[int]] = {}  # seq id -> device block ids
        self.filled: dict[int, int] = {}  # seq id -> tokens whose K/V are written
        self.hashes: dict[int, list[bytes]] = {}  # seq id -> chain hashes of its full, computed blocks

        self.host_ref_count = [0] * num_host_blocks
        self.host_free_ids: deque[int] = deque(range(num_host_blocks))
        self.host_tables: dict[int, list[int]] = {}  # swapped-out seq id -> host block ids

        self.prefix_query_tokens = 0
        self.prefix_hit_tokens = 0

    # ---- capacity -------------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self.free_ids) + len(self.evictable)

    @property
    def usage(self) -> float:
        return 1.0 - self.num_free_blocks / self.num_blocks

    def blocks_needed(self, seq_id: int, num_slots: int) -> int:
        """Blocks `ensure_slots(seq_id, num_slots)` would take, copy-on-write included."""
        table = self.tables.get(seq_id, [])
        new = max(0, -(-num_slots // self.block_size) - len(table))
        return new + len(self._shared_blocks_in_write_range(seq_id, num_slots))

    # ---- allocation -----------------------------------------------------------------------------
    def _take_block(self) -> int:
        if self.free_ids:
            block = self.free_ids.popleft()
        elif self.evictable:
            block, _ = self.evictable.popitem(last=False)
            del self.hash_to_block[self.block_hash[block]]
            self.block_hash[block] = self.block_key[block] = None
        else:
            raise NoFreeBlocksError("no free KV blocks")
        self.ref_count[block] = 1
        return block

    def _release_block(self, block: int) -> None:
        self.ref_count[block] -= 1
        if self.ref_count[block] == 0:
            if self.block_hash[block] is not None:
                self.evictable[block] = None
            else:
                self.free_ids.append(block)

    def _acquire_cached(self, block: int) -> None:
        if self.ref_count[block] == 0:
            del self.evictable[block]
        self.ref_count[block] += 1

    def allocate_prefix(self, seq_id: int, token_ids: list[int], shared_from: int | None = None,
                        num_shared: int = 0) -> int:
        """Start a table for a new sequence, taking references on cached blocks of its prefix.

        With `shared_from`, the table starts with that sequence's first `num_shared` blocks, which must hold
        the same tokens with their K/V written (the other sequences of a request that restarts after losing
        its KV share its prompt this way, with or without the prefix cache). Returns how many leading tokens
        are already in the cache. At least one token is always left to compute, since the model must run
        on the last prompt token to produce the first output.
        """
        if seq_id in self.tables:
            raise ValueError(f"sequence {seq_id} already has a block table")
        table: list[int] = []
        hashes: list[bytes] = []
        if shared_from is not None and num_shared:
            table = self.tables[shared_from][:num_shared]
            hashes = self.hashes[shared_from][:num_shared]
            for block in table:
                self.ref_count[block] += 1
        if self.enable_prefix_caching and len(hashes) == len(table):
            self.prefix_query_tokens += len(token_ids)
            bs = self.block_size
            parent = hashes[-1] if hashes else None
            for i in range(len(table), (len(token_ids) - 1) // bs):
                tokens = tuple(token_ids[i * bs : (i + 1) * bs])
                h = chain_hash(parent, tokens)
                block = self.hash_to_block.get(h)
                if block is None or self.block_key[block] != (parent, tokens):
                    break
                self._acquire_cached(block)
                table.append(block)
                hashes.append(h)
                parent = h
            self.prefix_hit_tokens += (len(table) - min(num_shared, len(table))) * bs
        self.tables[seq_id] = table
        self.hashes[seq_id] = hashes
        self.filled[seq_id] = len(table) * self.block_size
        return self.filled[seq_id]

    def _shared_blocks_in_write_range(self, seq_id: int, num_slots: int) -> list[int]:
        table = self.tables.get(seq_id, [])
        first = self.filled.get(seq_id, 0) // self.block_size
        last = min(len(table), -(-num_slots // self.block_size))
        return [i for i in range(first, last) if self.ref_count[table[i]] > 1]

    def ensure_slots(self, seq_id: int, num_slots: int) -> BlockOps:
        """Make the sequence's table cover `num_slots` token slots, copying shared blocks it will write into.

        All or nothing: raises NoFreeBlocksError without changing anything if the pool is short.
        """
        needed = self.blocks_needed(seq_id, num_slots)
        if needed == 0:
            return _NO_OPS  # the common decode step: room left in the last, unshared block
        if needed > self.num_free_blocks:
            raise NoFreeBlocksError(f"sequence {seq_id} needs more KV blocks than are free")
        ops = BlockOps()
        table = self.tables[seq_id]
        for i in self._shared_blocks_in_write_range(seq_id, num_slots):
            src = table[i]
            dst = self._take_block()
            self._release_block(src)
            table[i] = dst
            ops.add(COPY, src, dst)
        while len(table) * self.block_size < num_slots:
            table.append(self._take_block())
        return ops

    def commit(self, seq_id: int, token_ids: list[int], num_computed: int) -> None:
        """Record that the first `num_computed` tokens' K/V are written; publish newly full blocks."""
        self.filled[seq_id] = num_computed
        if not self.enable_prefix_caching:
            return
        table, hashes, bs = self.tables[seq_id], self.hashes[seq_id], self.block_size
        while len(hashes) < num_computed // bs:
            i = len(hashes)
            parent, tokens = hashes[-1] if hashes else None, tuple(token_ids[i * bs : (i + 1) * bs])
            h = chain_hash(parent, tokens)
            hashes.append(h)
            block = table[i]
            # Publish only if no other block holds this content and the block is ours alone to name.
            if h not in self.hash_to_block and self.block_hash[block] is None:
                self.block_hash[block] = h
                self.block_key[block] = (parent, tokens)
                self.hash_to_block[h] = block

    def fork(self, parent_id: int, child_id: int) -> None:
        """The child shares every block of the parent; whichever writes into a shared block copies it."""
        self.tables[child_id] = list(self.tables[parent_id])
        self.hashes[child_id] = list(self.hashes[parent_id])
        self.filled[child_id] = self.filled[parent_id]
        for block in self.tables[child_id]:
            self.ref_count[block] += 1

    def free(self, seq_id: int) -> None:
        """Drop the sequence's references. Tail blocks are released first, so they are evicted first."""
        for block in reversed(self.tables.pop(seq_id, [])):
            self._release_block(block)
        self.hashes.pop(seq_id, None)
        self.filled.pop(seq_id, None)
        for block in self.host_tables.pop(seq_id, []):
            self._release_host_block(block)

    def block_table(self, seq_id: int) -> list[int]:
        return self.tables[seq_id]

    # ---- swapping -------------------------------------------------------------------------------
    def _distinct_blocks(self, tables: list[list[int]]) -> list[int]:
        return list(dict.fromkeys(b for t in tables for b in t))

    def can_swap_out(self, seq_ids: list[int]) -> bool:
        return len(self._distinct_blocks([self.tables[s] for s in seq_ids])) <= len(self.host_free_ids)

    def swap_out(self, seq_ids: list[int]) -> BlockOps:
        """Move a group of sequences (e.g. a request's n) to the host pool; shared blocks stay shared."""
        if not self.can_swap_out(seq_ids):
            raise NoFreeBlocksError("host swap pool is full")
        mapping: dict[int, int] = {}
        ops = BlockOps()
        for block in self._distinct_blocks([self.tables[s] for s in seq_ids]):
            host = self.host_free_ids.popleft()
            mapping[block] = host
            ops.add(SWAP_OUT, block, host)
        for s in seq_ids:
            table = self.tables.pop(s)
            self.host_tables[s] = [mapping[b] for b in table]
            for block in self.host_tables[s]:
                self.host_ref_count[block] += 1
            for block in reversed(table):
                self._release_block(block)
        return ops

    def host_blocks_of(self, seq_ids: list[int]) -> list[int]:
        return self._distinct_blocks([self.host_tables[s] for s in seq_ids])

    def blocks_to_resume(self, seq_slots: list[tuple[int, int]]) -> int:
        """Device blocks that swapping these sequences in and growing each to its slot count would take,
        in that order: their distinct host blocks, then what `ensure_slots` would add (copy-on-write of a
        block they share included; the last sharer to write keeps the block)."""
        refs: dict[int, int] = {}
        for seq_id, _ in seq_slots:
            for host in self.host_tables[seq_id]:
                refs[host] = refs.get(host, 0) + 1
        needed = len(refs)
        bs = self.block_size
        for seq_id, num_slots in seq_slots:
            table = self.host_tables[seq_id]
            last = -(-num_slots // bs)
            for i in range(self.filled.get(seq_id, 0) // bs, min(len(table), last)):
                if refs[table[i]] > 1:
                    refs[table[i]] -= 1
                    needed += 1
            needed += max(0, last - len(table))
        return needed

    def can_swap_in(self, seq_ids: list[int]) -> bool:
        return len(self.host_blocks_of(seq_ids)) <= self.num_free_blocks

    def swap_in(self, seq_ids: list[int]) -> BlockOps:
        if not self.can_swap_in(seq_ids):
            raise NoFreeBlocksError("not enough free KV blocks to swap in")
        mapping: dict[int, int] = {}
        ops = BlockOps()
        for host in self.host_blocks_of(seq_ids):
            block = self._take_block()
            self.ref_count[block] = 0  # references are counted per table below
            mapping[host] = block
            ops.add(SWAP_IN, host, block)
        for s in seq_ids:
            host_table = self.host_tables.pop(s)
            self.tables[s] = [mapping[h] for h in host_table]
            for block in self.tables[s]:
                self.ref_count[block] += 1
            for host in host_table:
                self._release_host_block(host)
        return ops

    def _release_host_block(self, host: int) -> None:
        self.host_ref_count[host] -= 1
        if self.host_ref_count[host] == 0:
            self.host_free_ids.append(host)

    # ---- stats and checks -----------------------------------------------------------------------
    def stats(self) -> KVStats:
        bs = self.block_size
        fill: dict[int, int] = {}
        for seq_id, table in self.tables.items():
            n = self.filled.get(seq_id, 0)
            for i, block in enumerate(table):
                fill[block] = max(fill.get(block, 0), min(bs, max(0, n - i * bs)))
        used = sum(1 for r in self.ref_count if r > 0)
        allocated_slots = used * bs
        unfilled = allocated_slots - sum(fill.values())
        return KVStats(
            num_blocks=self.num_blocks,
            used_blocks=used,
            cached_blocks=len(self.evictable),
            free_blocks=len(self.free_ids),
            usage=self.usage,
            fragmentation=unfilled / allocated_slots if allocated_slots else 0.0,
            blocks_saved_by_sharing=sum(r - 1 for r in self.ref_count if r > 1),
            host_blocks=self.num_host_blocks,
            host_used_blocks=self.num_host_blocks - len(self.host_free_ids),
            prefix_query_tokens=self.prefix_query_tokens,
            prefix_hit_tokens=self.prefix_hit_tokens,
        )

    def check_integrity(self) -> None:
        """free + cached + used == total, and every reference count matches the block tables."""
        expected = [0] * self.num_blocks
        for table in self.tables.values():
            for block in table:
                expected[block] += 1
        assert expected == self.ref_count, "device reference counts disagree with the block tables"
        free, cached = set(self.free_ids), set(self.evictable)
        used = {b for b, r in enumerate(self.ref_count) if r > 0}
        assert len(free) == len(self.free_ids), "a block is on the free list twice"
        assert not (free & cached) and not (free & used) and not (cached & used), "a block is in two states"
        assert len(free) + len(cached) + len(used) == self.num_blocks, "a block leaked"
        for block in cached:
            assert self.block_hash[block] is not None, "an evictable block has no hash"
        for h, block in self.hash_to_block.items():
            assert self.block_hash[block] == h, "prefix index points at a block holding other content"
        for block in free:
            assert self.block_hash[block] is None and self.block_key[block] is None, "a free block still carries a hash"
        host_expected = [0] * self.num_host_blocks
        for table in self.host_tables.values():
            for block in table:
                host_expected[block] += 1
        assert host_expected == self.host_ref_count, "host reference counts disagree with the host tables"
        host_free = set(self.host_free_ids)
        assert len(host_free) == len(self.host_free_ids), "a host block is on the free list twice"
        assert host_free == {b for b, r in enumerate(self.host_ref_count) if r == 0}, "a host block leaked"
        assert not (set(self.tables) & set(self.host_tables)), "a sequence is both swapped and resident"
