"""Arrival processes: precomputed, seeded schedules (the same seed gives the same run).

Open loop: ``poisson``, ``gamma`` (burstiness b: shape b, so CV = 1/sqrt(b); b = 1 is Poisson, b < 1
burstier, as in vLLM's ``--burstiness``), ``constant``. Closed loop (``concurrency`` N) has no
schedule: each of N users sends its next request when its previous one ends.

**Exact counts** (``times(exact_at=...)``): at each mark the schedule has sent exactly rate x mark requests
(rounded), so a window between two marks offers exactly its rate. Between two marks the arrivals are the
process's own gaps, scaled to fit their count: for Poisson that is the process conditioned on its count
(the arrivals uniform over the stretch), for gamma its gaps' shape with the count fixed, for constant the
even spacing. After the last mark the process runs free. Why: a drawn Poisson count over a 16 s window at
55 req/s is off by 3.4 % (sd: 1 / sqrt(880)), and a capacity search that reports the offered rate carries
that noise into its rating. The price: a window whose count cannot run high misses some of the bursts that
make a Poisson p99, so it passes at loads a free process would fail (``search.window_counts``, off by default;
what it changes is measured in docs/validation.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

KINDS = ("poisson", "gamma", "constant", "closed")


@dataclass(slots=True)
class Arrivals:
    kind: str = "poisson"
    rate: float = 1.0  # requests per second (open loop)
    burstiness: float = 1.0  # gamma shape
    concurrency: int = 0  # closed loop: users

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"arrival must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if self.kind == "closed":
            if self.concurrency < 1:
                raise ValueError("closed-loop arrivals need concurrency >= 1")
        elif not self.rate > 0:
            raise ValueError(f"rate must be > 0, got {self.rate}")
        if not self.burstiness > 0:
            raise ValueError(f"burstiness must be > 0, got {self.burstiness}")

    @property
    def closed(self) -> bool:
        return self.kind == "closed"

    def times(self, n: int | None = None, duration_s: float | None = None, seed: int = 0,
              exact_at: Sequence[float] = ()) -> np.ndarray:
        """Send times in seconds from the run start (first request at 0 for constant, else at gap 1).

        Give ``n`` (number of requests), ``duration_s`` (all arrivals before it), or both (whichever
        ends first). Closed loop returns zeros: the client fills in the actual send times. ``exact_at``:
        marks (s) where the count sent so far is exactly rate x mark (see the module's docstring); the
        schedule up to any time is the same whatever ``n`` or ``duration_s`` asks for.
        """
        if n is None and duration_s is None:
            raise ValueError("give a number of requests or a duration")
        if self.closed:
            if n is None:
                raise ValueError("closed-loop load needs a number of requests")
            return np.zeros(n)
        rng = np.random.default_rng(seed)
        marks = sorted({float(m) for m in exact_at})
        if marks and not marks[0] > 0:
            raise ValueError(f"exact_at: marks must be > 0, got {marks[0]}")
        head = self._counted(rng, marks)
        start = marks[-1] if marks else 0.0
        cap = n if n is not None else int(max(0.0, duration_s - start) * self.rate * 1.5 + 100)
        out = np.concatenate([head, start + self._gaps(rng, cap).cumsum()])
        if duration_s is not None:
            while n is None and out[-1] < duration_s:  # rare: draw more until past the end
                out = np.concatenate([out, out[-1] + self._gaps(rng, cap).cumsum()])
            out = out[out < duration_s]
        return out[:n] if n is not None else out

    def _counted(self, rng: np.random.Generator, marks: list[float]) -> np.ndarray:
        """The arrivals up to the last mark, exactly round(rate x mark) of them before each mark."""
        parts, sent, prev = [], 0, 0.0
        for mark in marks:
            k = round(self.rate * mark) - sent
            gaps = self._gaps(rng, k + 1)  # k arrivals and the gap after the last: scaled to the stretch
            total = gaps.sum()
            if k > 0:
                frac = gaps.cumsum()[:k] / total if total > 0 else np.arange(k) / k
                parts.append(prev + (mark - prev) * frac)
            sent, prev = sent + k, mark
        return np.concatenate(parts) if parts else np.empty(0)

    def _gaps(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if self.kind == "constant":
            g = np.full(n, 1.0 / self.rate)
            g[0] = 0.0
            return g
        if self.kind == "poisson":
            return rng.exponential(1.0 / self.rate, size=n)
        return rng.gamma(self.burstiness, 1.0 / (self.rate * self.burstiness), size=n)
