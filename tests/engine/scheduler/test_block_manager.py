"""The block pool under random allocate / append / fork / free / swap sequences.

Besides `check_integrity()`, the machine keeps a fake physical cache: every token written lands in its
block's slot, and the copies and swaps the manager asks for are carried out on it. Reading any sequence
back through its block table must give its own tokens, which is what prefix sharing, copy-on-write and
swapping must preserve.
"""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from engine.scheduler import block_manager
from engine.scheduler.block_manager import BlockManager, NoFreeBlocksError
from engine.scheduler.block_ops import COPY, SWAP_IN, SWAP_OUT, BlockOps

BS = 4


class BlockPoolMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.bm = BlockManager(num_blocks=24, block_size=BS, num_host_blocks=16)
        self.device: dict[int, list] = {}
        self.host: dict[int, list] = {}
        self.tokens: dict[int, list[int]] = {}  # every sequence's tokens, resident or swapped
        self.next_id = 0

    def _apply(self, ops: BlockOps) -> None:
        """Replay the ops as the model runner does: batch by batch, each batch reading before it writes."""
        for kind, pairs in ops.batches():
            src_store, dst_store = {"swap_out": (self.device, self.host), "swap_in": (self.host, self.device),
                                    "copy": (self.device, self.device)}[kind]
            read = [list(src_store.get(src, [None] * BS)) for src, _ in pairs]
            for (_, dst), block in zip(pairs, read, strict=True):
                dst_store[dst] = block

    def _write(self, seq: int, upto: int) -> None:
        table, start = self.bm.tables[seq], self.bm.filled[seq]
        for pos in range(start, upto):
            self.device.setdefault(table[pos // BS], [None] * BS)[pos % BS] = self.tokens[seq][pos]
        self.bm.commit(seq, self.tokens[seq], upto)

    def _resident(self) -> list[int]:
        return sorted(self.bm.tables)

    def _grow(self, seq: int, new_tokens: list[int]) -> None:
        self.tokens[seq] = self.tokens[seq] + new_tokens
        target = len(self.tokens[seq])
        try:
            ops = self.bm.ensure_slots(seq, target)
        except NoFreeBlocksError:
            self.tokens[seq] = self.tokens[seq][: len(self.tokens[seq]) - len(new_tokens)]
            return
        self._apply(ops)
        self._write(seq, target)

    @rule(prompt=st.lists(st.integers(0, 2), min_size=1, max_size=14))
    def new_sequence(self, prompt):
        # A tiny alphabet makes shared prefixes (and so cache hits) common.
        seq, self.next_id = self.next_id, self.next_id + 1
        cached = self.bm.allocate_prefix(seq, prompt)
        assert cached % BS == 0 and cached < len(prompt)
        self.tokens[seq] = prompt[:cached]
        self._grow(seq, prompt[cached:])

    @precondition(lambda self: self.bm.tables)
    @rule(data=st.data(), n=st.integers(1, 6))
    def append(self, data, n):
        seq = data.draw(st.sampled_from(self._resident()))
        self._grow(seq, data.draw(st.lists(st.integers(0, 2), min_size=n, max_size=n)))

    @precondition(lambda self: any(self.bm.filled[s] >= BS for s in self.bm.tables))
    @rule(data=st.data(), tail=st.lists(st.integers(0, 2), min_size=1, max_size=6))
    def share_prefix(self, data, tail):
        """A sequence starting with another's first full blocks (a restarting n > 1 request's prompt)."""
        src = data.draw(st.sampled_from([s for s in self._resident() if self.bm.filled[s] >= BS]))
        k = data.draw(st.integers(1, self.bm.filled[src] // BS))
        seq, self.next_id = self.next_id, self.next_id + 1
        tokens = self.tokens[src][: k * BS] + tail
        cached = self.bm.allocate_prefix(seq, tokens, src, k)
        assert k * BS <= cached < len(tokens) and self.bm.tables[seq][:k] == self.bm.tables[src][:k]
        self.tokens[seq] = tokens[:cached]
        self._grow(seq, tokens[cached:])

    @precondition(lambda self: self.bm.tables)
    @rule(data=st.data())
    def fork(self, data):
        parent = data.draw(st.sampled_from(self._resident()))
        child, self.next_id = self.next_id, self.next_id + 1
        self.bm.fork(parent, child)
        self.tokens[child] = list(self.tokens[parent])

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def free(self, data):
        seq = data.draw(st.sampled_from(sorted(self.tokens)))
        self.bm.free(seq)
        del self.tokens[seq]

    @precondition(lambda self: self.bm.tables)
    @rule(data=st.data())
    def swap_out(self, data):
        seq = data.draw(st.sampled_from(self._resident()))
        if self.bm.can_swap_out([seq]):
            self._apply(self.bm.swap_out([seq]))

    @precondition(lambda self: self.bm.host_tables)
    @rule(data=st.data())
    def swap_in(self, data):
        seq = data.draw(st.sampled_from(sorted(self.bm.host_tables)))
        if self.bm.can_swap_in([seq]):
            self._apply(self.bm.swap_in([seq]))

    @invariant()
    def accounting_holds(self):
        self.bm.check_integrity()

    @invariant()
    def every_sequence_reads_back_its_own_tokens(self):
        for seq, tokens in self.tokens.items():
            swapped = seq in self.bm.host_tables
            table = self.bm.host_tables[seq] if swapped else self.bm.tables[seq]
            store = self.host if swapped else self.device
            assert len(table) * BS >= len(tokens)
            read = [store[table[p // BS]][p % BS] for p in range(len(tokens))]
            assert read == tokens, f"sequence {seq} reads {read}, wrote {tokens}"

    def teardown(self):
        for seq in list(self.tokens):
            self.bm.free(seq)
        self.bm.check_integrity()
        assert self.bm.stats().used_blocks == 0, "blocks leaked after freeing every sequence"
        assert self.bm.host_free_ids and len(self.bm.host_free_ids) == self.bm.num_host_blocks


TestBlockPool = BlockPoolMachine.TestCase
TestBlockPool.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


def test_shared_prefix_takes_fewer_blocks_and_counts_hits():
    bm = BlockManager(num_blocks=32, block_size=4)
    system = list(range(12))  # three full blocks
    a = bm.allocate_prefix(0, system + [100, 101])
    assert a == 0
    bm.ensure_slots(0, 14)
    bm.commit(0, system + [100, 101], 14)
    b = bm.allocate_prefix(1, system + [200])
    assert b == 12, "the three full system-prompt blocks should come from the cache"
    assert bm.tables[1][:3] == bm.tables[0][:3]
    assert bm.stats().blocks_saved_by_sharing == 3
    assert bm.stats().prefix_hit_tokens == 12
    bm.check_integrity()


def test_whole_cached_prompt_still_leaves_a_token_to_compute():
    bm = BlockManager(num_blocks=8, block_size=4)
    prompt = list(range(8))
    bm.allocate_prefix(0, prompt)
    bm.ensure_slots(0, 8)
    bm.commit(0, prompt, 8)
    bm.free(0)
    assert bm.stats().cached_blocks == 2
    assert bm.allocate_prefix(1, prompt) == 4  # the last block is recomputed: its last token gives logits


def test_copy_on_write_on_shared_partial_block():
    bm = BlockManager(num_blocks=8, block_size=4)
    bm.allocate_prefix(0, [1, 2, 3, 4, 5, 6])
    bm.ensure_slots(0, 6)
    bm.commit(0, [1, 2, 3, 4, 5, 6], 6)
    bm.fork(0, 1)
    ops = bm.ensure_slots(1, 7)
    assert ops.copies == [(bm.tables[0][1], bm.tables[1][1])], "the partly filled shared block is copied"
    assert bm.tables[0][0] == bm.tables[1][0], "the full block stays shared"
    bm.check_integrity()


def test_fragmentation_counts_unfilled_slots():
    bm = BlockManager(num_blocks=8, block_size=4, enable_prefix_caching=False)
    bm.allocate_prefix(0, [1] * 5)
    bm.ensure_slots(0, 5)
    bm.commit(0, [1] * 5, 5)
    assert bm.stats().fragmentation == pytest.approx(3 / 8)


def test_all_or_nothing_when_short():
    bm = BlockManager(num_blocks=2, block_size=4)
    bm.allocate_prefix(0, [1])
    with pytest.raises(NoFreeBlocksError):
        bm.ensure_slots(0, 12)
    assert bm.tables[0] == [] and bm.num_free_blocks == 2
    bm.check_integrity()


def cached_prompt(bm: BlockManager, seq: int, tokens: list[int]) -> None:
    bm.allocate_prefix(seq, tokens)
    bm.ensure_slots(seq, len(tokens))
    bm.commit(seq, tokens, len(tokens))


def test_a_prefix_hit_compares_token_ids_not_only_the_hash(monkeypatch):
    # Every block hashing alike (a collision, as Python's hash() has) must not hand over another prompt's KV.
    monkeypatch.setattr(block_manager, "chain_hash", lambda parent, tokens: b"same")
    bm = BlockManager(num_blocks=8, block_size=4)
    cached_prompt(bm, 0, [1, 2, 3, 4, 9])
    assert bm.allocate_prefix(1, [5, 6, 7, 8, 9]) == 0, "different tokens, same hash: no hit"
    assert bm.allocate_prefix(2, [1, 2, 3, 4, 7]) == 4, "the same tokens still hit"
    bm.check_integrity()


def test_the_chain_hash_is_sha256_not_pythons_hash():
    # hash() of an int is the int modulo 2**61 - 1, so these two blocks collided under hash((parent, tokens)).
    assert hash((None, (5,) * 4)) == hash((None, (2**61 + 4,) * 4))
    assert block_manager.chain_hash(None, [5] * 4) != block_manager.chain_hash(None, [2**61 + 4] * 4)
    bm = BlockManager(num_blocks=8, block_size=4)
    cached_prompt(bm, 0, [5] * 4 + [1])
    assert bm.allocate_prefix(1, [2**61 + 4] * 4 + [1]) == 0


def test_ops_replay_in_the_order_asked():
    # A copy-on-write copy into block 3, then a swap-out of block 3: the copy must land first.
    ops = BlockOps()
    ops.add(COPY, 1, 3)
    ops.add(COPY, 2, 4)
    ops.add(SWAP_OUT, 3, 0)
    ops.add(SWAP_OUT, 4, 1)
    ops.add(SWAP_IN, 0, 5)
    ops.add(SWAP_IN, 7, 5)  # block 5 freed and taken again: the later write must win
    ops.add(COPY, 5, 6)
    ops.add(COPY, 6, 8)  # reads what the copy before it wrote: a batch of its own
    assert ops.batches() == [(COPY, [(1, 3), (2, 4)]), (SWAP_OUT, [(3, 0), (4, 1)]), (SWAP_IN, [(0, 5)]),
                             (SWAP_IN, [(7, 5)]), (COPY, [(5, 6)]), (COPY, [(6, 8)])]
    assert ops.copies == [(1, 3), (2, 4), (5, 6), (6, 8)] and ops.swap_in == [(0, 5), (7, 5)]


def test_blocks_to_resume_counts_the_copies_a_swapped_group_makes():
    bm = BlockManager(num_blocks=16, block_size=4, num_host_blocks=16)
    cached_prompt(bm, 0, [1, 2, 3, 4, 5, 6])  # one full block, one partial
    bm.fork(0, 1)
    bm.fork(0, 2)
    bm.swap_out([0, 1, 2])
    need = bm.blocks_to_resume([(0, 7), (1, 7), (2, 7)])
    assert need == 2 + 2, "two blocks back, and two of the three writers copy the shared partial block"
    free = bm.num_free_blocks
    bm.swap_in([0, 1, 2])
    for seq in (0, 1, 2):
        bm.ensure_slots(seq, 7)
    assert free - bm.num_free_blocks == need
    bm.check_integrity()
