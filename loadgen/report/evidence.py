"""The rating's evidence, for the report: for each judged SLO, every counted window's share of requests
over its threshold against the load the rating places it at (``capacity.rating.step_load``), the fits
``capacity.crossing`` makes of those shares, and where they cross the SLO's level (1 - quantile).

summary.json keeps each window's counts (``tiers.<tier>.judged.<metric>``: ``over`` of ``n``) and the
crossings, not the fitted curves, so the curves are made here from those counts by the functions the
rating itself calls, never a second fit: ``crossing.slo_crossing`` for the crossing, ``crossing.isotonic``
for the monotone fit (the shares pooled per load, weighted by requests), and ``crossing.logistic_fit``
over the windows within ``crossing.NEIGHBOURHOOD`` of the crossing for the local logistic fit (where the
rating's fit is logistic: over every window when that is what it rested on).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from loadgen.capacity.crossing import NEIGHBOURHOOD, isotonic, logistic_fit, slo_crossing
from loadgen.capacity.rating import step_load
from loadgen.report import data as d

CURVE_POINTS = 80


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


@dataclass
class Window:
    """One counted step's judgement of one SLO."""

    index: int
    phase: str
    load: float
    over: float
    n: float
    passed: bool | None

    @property
    def share(self) -> float:
        return self.over / self.n


@dataclass
class SLOEvidence:
    tier: str
    metric: str
    threshold_ms: float
    level: float  # the share over the threshold the SLO allows: 1 - its quantile
    windows: list[Window]
    crossing: float
    open: str | None  # "above" / "below": the windows do not cross the level (the crossing is the last load)
    fit: str  # "logistic" | "isotonic"
    fit_windows: int
    iso_x: list[float] = field(default_factory=list)  # the isotonic fit at each load tried
    iso_y: list[float] = field(default_factory=list)
    curve_x: list[float] = field(default_factory=list)  # the logistic fit (empty where the isotonic stands)
    curve_y: list[float] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"{self.tier} {self.metric.removesuffix('_ms').upper()}"


def slo_windows(steps: list[dict[str, Any]], axis: str) -> dict[tuple[str, str], tuple[float, float, list[Window]]]:
    """{(tier, metric): (threshold, level, windows sorted by load)} of the counted steps that judged it."""
    out: dict[tuple[str, str], tuple[float, float, list[Window]]] = {}
    for st in steps:
        if st.get("counted") is False or not isinstance(st.get("index"), int):
            continue
        x = step_load(st, axis)
        if x is None or x <= 0:
            continue
        for tier, e in (st.get("tiers") or {}).items():
            if not isinstance(e, dict):
                continue
            for metric, j in (e.get("judged") or {}).items():
                n, thr, over = _num(j.get("n")), _num(j.get("threshold_ms")), _num(j.get("over"))
                if not n or not thr or over is None or j.get("statistic") == "mean":  # a mean has no share
                    continue
                level = 1.0 - float(j.get("quantile") or e.get("quantile") or 0.99)
                entry = out.setdefault((str(tier), str(metric)), (thr, level, []))
                entry[2].append(Window(st["index"], str(st.get("phase") or ""), x, over, n, j.get("passed")))
    for _k, (_t, _l, ws) in out.items():
        ws.sort(key=lambda w: (w.load, w.index))
    return out


def slo_evidence(run: d.RunData) -> list[SLOEvidence]:
    """Each judged SLO's windows, fits and crossing (empty for a run without counted judgements)."""
    steps = [s for s in run.summary.get("steps") or [] if isinstance(s, dict)]
    axis, _ = d.load_axis(run)
    out = []
    for (tier, metric), (thr, level, ws) in sorted(slo_windows(steps, axis).items()):
        x = np.asarray([w.load for w in ws])
        over = np.asarray([w.over for w in ws])
        n = np.asarray([w.n for w in ws])
        c, open_end, k = slo_crossing(x, over, n, level)
        ev = SLOEvidence(tier, metric, thr, level, ws, c, open_end, "logistic" if k else "isotonic", k)
        ux, inv = np.unique(x, return_inverse=True)
        pooled_n = np.bincount(inv, n, len(ux))
        g = isotonic(np.bincount(inv, over, len(ux)) / np.maximum(pooled_n, 1e-12), pooled_n)
        ev.iso_x, ev.iso_y = ux.tolist(), g.tolist()
        if k:
            near = (x >= c / NEIGHBOURHOOD) & (x <= c * NEIGHBOURHOOD)
            if int(near.sum()) != k:  # the rating fell back on the fit over every window
                near = np.ones_like(x, dtype=bool)
            ab = logistic_fit(x[near], over[near], n[near])
            if ab is not None:
                xs = np.geomspace(float(x[near].min()), float(x[near].max()), CURVE_POINTS)
                ev.curve_x = xs.tolist()
                ev.curve_y = (1.0 / (1.0 + np.exp(-(ab[0] + ab[1] * np.log(xs))))).tolist()
        out.append(ev)
    return out


def interval(run: d.RunData) -> dict[str, Any] | None:
    """The rating's estimate and interval (``rated_capacity``), when it has one."""
    rc = run.summary.get("rated_capacity")
    if not isinstance(rc, dict) or _num(rc.get("estimate")) is None:
        return None
    detail = rc.get("interval") if isinstance(rc.get("interval"), dict) else {}
    return {"estimate": rc["estimate"], "ci_low": _num(rc.get("ci_low")), "ci_high": _num(rc.get("ci_high")),
            "confidence": _num(rc.get("confidence")), "boundary": rc.get("boundary"),
            "binding": rc.get("binding") if isinstance(rc.get("binding"), dict) else None,
            "method": detail.get("interval_method"), "cliff_gap": detail.get("cliff_gap"),
            "unbounded": [e for e in rc.get("ci_unbounded") or [] if e in ("low", "high")]}
