"""Sustained deviation: each signal's looks judged against its baseline (``signals.beyond``), and how long
it has stayed beyond it. A deviation is sustained once it has lasted ``sustain_s`` without a look back
inside the tolerance; a look without data (no request finished in the window, say) neither starts nor ends
one; a lower-is-bad signal is not judged while the server is not under load, and that ends a deviation
(light traffic, not a sick service)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from loadgen.monitoring.signals import SIGNALS, Signal, beyond, limit

OK, DEVIATING, SUSTAINED = "ok", "deviating", "SUSTAINED"
NO_DATA, NO_BASELINE, IDLE = "no data", "no baseline", "idle"


@dataclass(frozen=True)
class Judgement:
    signal: str
    value: float | None
    baseline: float | None
    limit: float | None
    state: str  # ok | deviating | SUSTAINED | no data | no baseline | idle
    for_s: float | None  # how long it has been beyond its limit

    def as_dict(self) -> dict:
        return {"value": self.value, "baseline": self.baseline, "limit": self.limit, "state": self.state,
                "for_s": None if self.for_s is None else round(self.for_s, 3)}


class DeviationTracker:
    """``update(t, values, under_load)`` for each look; ``sustained``: the signals that ever were."""

    def __init__(self, baseline: Mapping[str, float | None], tolerance: float, sustain_s: float,
                 signals: Sequence[Signal] = SIGNALS):
        self.baseline, self.tolerance, self.sustain_s = dict(baseline), tolerance, sustain_s
        self.signals = tuple(signals)
        self.since: dict[str, float | None] = {s.key: None for s in self.signals}
        self.sustained: set[str] = set()

    def update(self, t: float, values: Mapping[str, float | None], under_load: bool) -> dict[str, Judgement]:
        out = {}
        for s in self.signals:
            out[s.key] = self.judge(s, t, values.get(s.key), under_load)
        return out

    def judge(self, s: Signal, t: float, value: float | None, under_load: bool) -> Judgement:
        base = self.baseline.get(s.key)
        if base is None:
            return Judgement(s.key, value, None, None, NO_BASELINE, None)
        lim = limit(s, base, self.tolerance)
        if s.bad == "low" and not under_load:
            self.since[s.key] = None
            return Judgement(s.key, value, base, lim, IDLE, None)
        since = self.since[s.key]
        if value is None:
            state = NO_DATA if since is None else self.state_of(s, t, since)
            return Judgement(s.key, None, base, lim, state, None if since is None else t - since)
        if not beyond(s, value, base, self.tolerance):
            self.since[s.key] = None
            return Judgement(s.key, value, base, lim, OK, None)
        if since is None:
            since = self.since[s.key] = t
        return Judgement(s.key, value, base, lim, self.state_of(s, t, since), t - since)

    def state_of(self, s: Signal, t: float, since: float) -> str:
        if t - since >= self.sustain_s:
            self.sustained.add(s.key)
            return SUSTAINED
        return DEVIATING
