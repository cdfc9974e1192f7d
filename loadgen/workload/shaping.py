"""Fitting a production trace to the target: length scaling and caps, and spreading timestamp ties.

Every trace builder (``Scenario`` for ``slobench run``, each capacity step, each Locust ramp stage)
calls :func:`load_shaped_trace`, so a scenario's ``input_scale`` or ``spread_ties_s`` means the same
thing whichever command or driver replays it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from loadgen.workload.specs import BlockPrompt, RequestSpec
from loadgen.workload.traces import TraceInfo, TraceOptions, load_trace


@dataclass(slots=True)
class TraceShaping:
    """A trace workload's ``input_scale`` ... ``spread_ties_s`` (the defaults leave a trace as it is)."""

    input_scale: float = 1.0  # multiply prompt lengths (a Mooncake hash block shrinks with them)
    output_scale: float = 1.0  # multiply answer lengths
    max_input_len: int | None = None  # caps, applied after scaling
    max_output_len: int | None = None
    spread_ties_s: float = 0.0  # trace seconds over which requests sharing a timestamp are spread


def load_shaped_trace(path: str | Path, fmt: str | None, opts: TraceOptions,
                      shaping: TraceShaping) -> tuple[list[RequestSpec], TraceInfo]:
    """``load_trace``, then scaled and capped lengths, then spread ties. ``spread_ties_s`` is in trace
    seconds, so it is stretched by the same factor as the trace's gaps (``info.time_factor``). ``info``
    describes the schedule as loaded, before the ties were spread."""
    specs, info = load_trace(path, fmt, opts)
    scale_specs(specs, shaping.input_scale, shaping.output_scale, shaping.max_input_len, shaping.max_output_len)
    spread_ties(specs, shaping.spread_ties_s * info.time_factor)
    return specs, info


def spread_ties(specs: list[RequestSpec], width_s: float) -> None:
    """Requests that share a timestamp (a trace logged in buckets: Mooncake's are 3 s) are spread evenly
    over ``width_s`` after it, in their order, instead of arriving in the same instant."""
    if width_s <= 0 or not specs:
        return
    i = 0
    while i < len(specs):
        j = i
        while j + 1 < len(specs) and specs[j + 1].arrival_s == specs[i].arrival_s:
            j += 1
        n = j - i + 1
        for k in range(1, n):
            specs[i + k].arrival_s += width_s * k / n
        i = j + 1
    specs.sort(key=lambda sp: sp.arrival_s)


def scale_specs(specs: list[RequestSpec], input_scale: float = 1.0, output_scale: float = 1.0,
                max_input_len: int | None = None, max_output_len: int | None = None) -> None:
    """Scale (then cap) the lengths of trace requests in place. Block prompts keep their hash ids with a
    proportionally smaller block, so two prompts share the same fraction of their tokens as before."""
    if input_scale == 1.0 and output_scale == 1.0 and max_input_len is None and max_output_len is None:
        return
    for sp in specs:
        p = sp.prompt
        if isinstance(p, BlockPrompt) and (input_scale != 1.0 or max_input_len is not None):
            bs = max(1, round(p.block_size * input_scale))
            n = min(max(1, math.ceil(p.num_tokens * input_scale)), len(p.hash_ids) * bs)
            if max_input_len is not None:
                n = min(n, max_input_len)
            sp.prompt = BlockPrompt(p.hash_ids, n, bs, p.seed, p.token_range)
            sp.prompt_tokens = n
        out = max(1, math.ceil(sp.max_tokens * output_scale))
        sp.max_tokens = min(out, max_output_len) if max_output_len is not None else out
