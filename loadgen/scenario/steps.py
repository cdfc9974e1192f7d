"""The requests of one load step: what a capacity step and a Locust ramp stage send at a given load.

A step's arrival pattern is its ``draw``: draw 0 is the scenario's own seeded draw (``scn.seed``) scaled
to the step's rate (a Locust ramp's stages all use it, as does every step of a capacity search with
``search.arrivals: common``: steps that differ by load alone); draw ``k > 0`` (every later step of a
capacity search by default, its confirmations always) is a fresh pattern: seed ``arrival_seed(scn.seed,
k)`` for synthetic arrivals; for a timestamped trace, the k-th slice of the trace's rows after the first
(the rows a draw-0 step takes, then the next as many, ...; a trace too short for it wraps to the draws it
has), so a pattern that happens to be sparse or dense cannot bias the steps that decide a rating. Prompts
are drawn fresh for each step (seed ``scn.seed * 1000 + index + 1``), so one step's prefix cache never
serves the next. A trace step takes
the trace's first ``load x duration`` rows (at least ``TRACE_MIN_ROWS``) at mean rate ``load``, shaped as
the scenario says (``workload.shaping``) and cut at the step's end after its ties are spread. A
conversation's later turns (real history) go only while the step's window is open: one due after it ends is
not sent (``RequestSpec.send_by_s``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from loadgen.scenario.model import Scenario
from loadgen.workload.arrivals import Arrivals
from loadgen.workload.specs import RequestSpec

TRACE_MIN_ROWS = 50  # trace rows a rate step draws on at least (a short slice of a bursty trace degenerates)


def arrival_seed(seed: int, draw: int) -> int:
    """The arrival pattern's seed of draw ``draw``: the scenario's own seed for draw 0 (common random
    numbers), a distinct one derived from both for every other draw."""
    if draw == 0:
        return seed
    return int(np.random.SeedSequence([seed, draw, 0xD4A]).generate_state(1)[0])


def step_specs(scn: Scenario, axis: str, load: float, index: int, start_s: float,
               duration_s: float, draw: int = 0, exact_at: Sequence[float] = ()) -> list[RequestSpec]:
    """The requests of one step, arrival times offset to ``start_s`` on the run's clock. Closed loop
    (``axis == 'concurrency'``): enough requests for ``load`` users for the whole step, in order.
    ``draw``: which arrival pattern (0: the common one; see the module's docstring). ``exact_at``: times
    from the step's start where exactly load x time requests have arrived (synthetic open-loop arrivals:
    ``Arrivals.times``; a trace keeps its own timestamps)."""
    seed = scn.seed * 1000 + index + 1  # fresh prompts per step; arrivals use scn.seed (common numbers)
    if draw < 0:
        raise ValueError(f"draw must be >= 0, got {draw}")
    if scn.workload_type == "synthetic":
        if axis == "rate":
            a = scn.arrivals if scn.arrivals and not scn.arrivals.closed else None
            arr = Arrivals(a.kind if a else "poisson", rate=load, burstiness=a.burstiness if a else 1.0)
            times = arr.times(duration_s=duration_s, seed=arrival_seed(scn.seed, draw), exact_at=exact_at)
        else:
            times = np.zeros(int(load * duration_s * 25) + 50)
        specs = scn.synthetic.generate(times, seed=seed)
        if axis == "rate":
            specs = [s for s in specs if s.arrival_s < duration_s]
    else:
        opts = dataclasses.replace(scn.trace_options, seed=seed)
        rows = max(TRACE_MIN_ROWS, math.ceil(load * duration_s))
        if axis == "rate":  # the trace's first load x duration rows (at least 50), at mean rate `load`
            opts.rate = load
            opts.max_requests = rows * (draw + 1)  # draw k: the k-th slice after the first
            opts.max_duration_s = None  # cut after the ties are spread
            if opts.arrivals is not None:
                opts.arrivals = dataclasses.replace(opts.arrivals, rate=load)
        else:
            opts.rate = None
            opts.max_duration_s = None
        specs, _ = scn.trace_specs(opts)
        if axis == "rate":
            if draw:
                specs = trace_slice(specs, rows, draw)
            specs = [s for s in specs if s.arrival_s < duration_s]
    scn.apply_cancel(specs, seed)
    scn.apply_deadlines(specs)
    for s in specs:
        s.id = f"s{index}-{s.id}"
        if s.conversation is not None:
            s.conversation = f"s{index}-{s.conversation}"
        s.arrival_s = start_s + (s.arrival_s if axis == "rate" else 0.0)
        if s.follow_up:  # a conversation's later turn due after the step's window is not sent
            s.send_by_s = start_s + duration_s
    return specs


def trace_slice(specs: list[RequestSpec], rows: int, draw: int) -> list[RequestSpec]:
    """Rows ``[k * rows, (k + 1) * rows)`` of a rate-scaled trace, shifted to start at 0: draw ``k``'s
    pattern (``k`` taken modulo the whole slices the trace holds; a trace of one slice repeats it)."""
    slices = max(1, len(specs) // rows)
    k = draw % slices
    part = specs[k * rows:(k + 1) * rows]
    if part and k:
        t0 = part[0].arrival_s
        for s in part:
            s.arrival_s -= t0
    return part
