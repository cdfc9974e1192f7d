"""The KV block moves a step needs before its forward pass, logged in the order the bookkeeping made them."""

from __future__ import annotations

from dataclasses import dataclass, field

SWAP_OUT, SWAP_IN, COPY = "swap_out", "swap_in", "copy"


@dataclass
class BlockOps:
    """Physical work for the model runner before the step's forward pass, in the order it was asked for.

    Every op is logged when the bookkeeping changes, and the runner replays the log in that order, so a
    block's contents always follow its bookkeeping: a copy-on-write copy queued for one sequence lands
    before a later preemption in the same step swaps that block out; a block freed by a swap-out may be
    the target of a later copy or swap-in; a host block freed by a swap-in may be written by a later
    swap-out. `batches()` groups the log into runs the runner can move in one indexed copy each.
    """

    log: list[tuple[str, int, int]] = field(default_factory=list)  # (kind, src block, dst block)

    def add(self, kind: str, src: int, dst: int) -> None:
        self.log.append((kind, src, dst))

    def extend(self, other: BlockOps) -> None:
        self.log += other.log

    def _of(self, kind: str) -> list[tuple[int, int]]:
        return [(src, dst) for k, src, dst in self.log if k == kind]

    @property
    def swap_out(self) -> list[tuple[int, int]]:  # (device block, host block)
        return self._of(SWAP_OUT)

    @property
    def swap_in(self) -> list[tuple[int, int]]:  # (host block, device block)
        return self._of(SWAP_IN)

    @property
    def copies(self) -> list[tuple[int, int]]:  # (src device block, dst device block)
        return self._of(COPY)

    def batches(self) -> list[tuple[str, list[tuple[int, int]]]]:
        """The log as consecutive runs of one kind in which no block is written twice and no copy reads a
        block written earlier in its run: each run is then one gather and one scatter, log order kept."""
        out: list[tuple[str, list[tuple[int, int]]]] = []
        written: set[int] = set()
        for kind, src, dst in self.log:
            if not out or out[-1][0] != kind or dst in written or (kind == COPY and src in written):
                out.append((kind, []))
                written = set()
            out[-1][1].append((src, dst))
            written.add(dst)
        return out

    def __bool__(self) -> bool:
        return bool(self.log)
