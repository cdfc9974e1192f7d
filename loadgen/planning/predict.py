"""Predictions from the simulation: each tier's SLO quantiles against load, and the rated capacity (the
highest load at which every tier's SLOs hold), on common random numbers (the same draws scaled to each
rate, so the curve is monotone in all but the simulated noise)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from loadgen.planning.requests import Requests
from loadgen.planning.simulate import EngineShape, simulate
from loadgen.planning.step_model import StepModel
from loadgen.results.latency import quantile
from loadgen.results.slo import SLO

DISCARD = 0.1  # the share of each draw's first requests dropped: the engine starts empty


@dataclass
class Predictor:
    draws: Sequence[Requests]
    engine: EngineShape
    model: StepModel
    slos: dict[str, list[SLO]]  # tier -> its judged SLOs

    def quantiles(self, rate: float) -> dict[str, dict[str, float]]:
        """Each judged tier's SLO quantiles (ms) at ``rate`` req/s, steady state, pooled over the draws."""
        pooled: dict[str, dict[str, list[np.ndarray]]] = {t: {} for t in self.slos}
        for d in self.draws:
            res = simulate(d, rate, self.engine, self.model)
            keep = slice(int(len(d) * DISCARD), None)
            for tier, ss in self.slos.items():
                mask = res.tier[keep] == tier
                for s in ss:
                    pooled[tier].setdefault(s.metric, []).append(res.values_ms(s.metric)[keep][mask])
        out: dict[str, dict[str, float]] = {}
        for tier, ss in self.slos.items():
            out[tier] = {}
            for s in ss:
                v = np.concatenate(pooled[tier][s.metric])
                v = v[~np.isnan(v)]
                out[tier][s.metric] = quantile(v, s.quantile) if v.size else float("nan")
        return out

    def margin_of(self, qs: dict[str, dict[str, float]]) -> float:
        """The largest quantile / threshold: at most 1 means every SLO holds."""
        return max(qs[t][s.metric] / s.threshold_ms for t, ss in self.slos.items() for s in ss)

    def point(self, rate: float) -> dict:
        qs = self.quantiles(rate)
        return {"load": rate, "quantiles_ms": qs, "margin": self.margin_of(qs)}

    def curve(self, loads: Sequence[float]) -> list[dict]:
        return [self.point(float(x)) for x in loads]

    def rated_capacity(self, start: float, rel_tol: float = 0.01, max_load: float = 1e6) -> float | None:
        """The highest rate whose SLOs all hold, by a ramp (x2 from ``start``) and bisection to
        ``rel_tol``. 0.0 when they fail even at start / 1024; None when they still hold at ``max_load``."""
        lo = hi = start
        if self.margin_of(self.quantiles(start)) <= 1.0:
            while self.margin_of(self.quantiles(hi)) <= 1.0:
                lo, hi = hi, hi * 2
                if hi > max_load:
                    return None
        else:
            while self.margin_of(self.quantiles(lo)) > 1.0:
                hi, lo = lo, lo / 2
                if lo < start / 1024:
                    return 0.0
        while hi - lo > rel_tol * lo:
            mid = 0.5 * (lo + hi)
            lo, hi = (mid, hi) if self.margin_of(self.quantiles(mid)) <= 1.0 else (lo, mid)
        return lo
