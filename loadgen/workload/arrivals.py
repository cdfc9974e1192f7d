"""Arrival processes: precomputed, seeded schedules (the same seed gives the same run).

Open loop: ``poisson``, ``gamma`` (burstiness b: shape b, so CV = 1/sqrt(b); b = 1 is Poisson, b < 1
burstier, as in vLLM's ``--burstiness``), ``constant``. Closed loop (``concurrency`` N) has no
schedule: each of N users sends its next request when its previous one ends.
"""

from __future__ import annotations

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

    def times(self, n: int | None = None, duration_s: float | None = None, seed: int = 0) -> np.ndarray:
        """Send times in seconds from the run start (first request at 0 for constant, else at gap 1).

        Give ``n`` (number of requests), ``duration_s`` (all arrivals before it), or both (whichever
        ends first). Closed loop returns zeros: the client fills in the actual send times.
        """
        if n is None and duration_s is None:
            raise ValueError("give a number of requests or a duration")
        if self.closed:
            if n is None:
                raise ValueError("closed-loop load needs a number of requests")
            return np.zeros(n)
        rng = np.random.default_rng(seed)
        cap = n if n is not None else int(duration_s * self.rate * 1.5 + 100)
        out = self._gaps(rng, cap).cumsum()
        if duration_s is not None:
            while n is None and out[-1] < duration_s:  # rare: draw more until past the end
                out = np.concatenate([out, out[-1] + self._gaps(rng, cap).cumsum()])
            out = out[out < duration_s]
        return out[:n] if n is not None else out

    def _gaps(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if self.kind == "constant":
            g = np.full(n, 1.0 / self.rate)
            g[0] = 0.0
            return g
        if self.kind == "poisson":
            return rng.exponential(1.0 / self.rate, size=n)
        return rng.gamma(self.burstiness, 1.0 / (self.rate * self.burstiness), size=n)
