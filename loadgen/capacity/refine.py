"""The refine load steps: windows at the rating's estimate, after the capacity search's bracket is confirmed.

``refine_steps`` (default 0) more windows, each with a fresh arrival draw, at the rating's current estimate
(``refine_centre(steps)``: ``capacity.run`` passes ``capacity.rating.estimate``, kept within ``REFINE_REACH``
of the bracket; the bracket's centre without one). They are for the rating's fit alone: they move neither
the bracket nor the verdict (``search_steps.judging`` leaves them out). The estimate rests on the windows
near the knee, and the search alone puts some ten there; windows at the estimate, which closes on the knee
as they come, narrow it: precision bought with time (``bench/results/calibration.json``, the
``simulated-gradual`` part).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from loadgen.capacity.search_steps import ArrivalDraws, Proposal, Step, on_axis
from loadgen.scenario.options import SearchConfig

REFINE_REACH = 1.25  # a refine window's load (the estimate) is kept within the bracket's ends / and x this

RefineCentre = Callable[[list[Step]], float | None]  # the steps so far -> the rating's estimate, if any


def refinement(cfg: SearchConfig, steps: list[Step], lo: float, hi: float, centre_of: RefineCentre | None,
               draws: ArrivalDraws) -> Proposal | None:
    """The next refine window, on a fresh draw, or None once ``cfg.refine_steps`` of them are measured."""
    done = sum(1 for s in steps if s.phase == "refine" and s.counted)
    if done >= cfg.refine_steps:
        return None
    centre = centre_of(steps) if centre_of else None
    if centre is None or not math.isfinite(centre):
        centre = math.sqrt(lo * hi)  # no estimate: the bracket's centre
    load = on_axis(min(max(centre, lo / REFINE_REACH), hi * REFINE_REACH), cfg.integer)
    return Proposal(load, "refine", draws.fresh())
