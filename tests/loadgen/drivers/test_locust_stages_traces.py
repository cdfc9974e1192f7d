"""A Locust ramp (``--slobench-steps``) over a trace scenario shapes its requests like ``slobench run`` and
``slobench capacity`` do: the scenario's ``input_scale`` / ``output_scale`` / caps fit the prompts to the
engine, and ``spread_ties_s`` spreads the trace's 3 s buckets. (The ramp used to send Mooncake's raw
12k-token prompts, all of a bucket in one instant.)"""

from __future__ import annotations

import dataclasses
import math

from loadgen.drivers.locust.stages import staged_load_from_scenario
from loadgen.scenario.parse import load_scenario
from loadgen.scenario.steps import step_specs
from loadgen.workload.traces import load_trace
from tests.helpers import REPO

SCENARIO = REPO / "loadgen" / "scenarios" / "replay-mooncake.yaml"
STEPS, STEP_S = [2.0, 4.0], 20.0


def _unshaped(scn, rate):
    """The rows a ramp stage draws on, as the trace has them (no scaling, no tie spreading)."""
    opts = dataclasses.replace(scn.trace_options, rate=rate, max_duration_s=None)
    specs, _ = load_trace(scn.trace_path, scn.trace_format, opts)
    return specs


def test_locust_ramp_scales_trace_lengths_by_the_scenario():
    scn = load_scenario(SCENARIO)
    sh = scn.shaping
    assert (sh.input_scale, sh.output_scale, sh.max_input_len, sh.max_output_len) == (1 / 32, 1 / 8, 2048, 64)
    staged = staged_load_from_scenario(SCENARIO, steps=STEPS, step_s=STEP_S)
    raw = {sp.id: sp for sp in _unshaped(scn, None)}
    for stage in staged.stages:
        assert len(stage.specs) > 10
        for sp in stage.specs:
            row = raw[sp.id.split("-", 1)[1]]  # "s{stage}-mooncake{i}": row i of the trace
            block = round(512 * sh.input_scale)  # 16: a hash block shrinks with the prompt
            want_in = min(math.ceil(row.prompt_tokens * sh.input_scale), len(row.prompt.hash_ids) * block,
                          sh.max_input_len)
            assert (sp.prompt_tokens, sp.prompt.num_tokens, sp.prompt.block_size) == (want_in, want_in, block)
            assert sp.max_tokens == min(max(1, math.ceil(row.max_tokens * sh.output_scale)), sh.max_output_len)


def test_locust_ramp_and_capacity_step_give_a_trace_row_the_same_lengths():
    scn = load_scenario(SCENARIO)
    load = STEPS[0]
    cap = {sp.id.split("-", 1)[1]: sp for sp in step_specs(scn, "rate", load, 0, 0.0, STEP_S)}
    ramp = {sp.id.split("-", 1)[1]: sp for sp in staged_load_from_scenario(SCENARIO, steps=[load], step_s=STEP_S)
            .stages[0].specs}
    both = sorted(set(cap) & set(ramp))
    assert len(both) > 10
    assert [(cap[k].prompt_tokens, cap[k].max_tokens) for k in both] == \
        [(ramp[k].prompt_tokens, ramp[k].max_tokens) for k in both]


def test_locust_ramp_spreads_the_trace_time_buckets():
    scn = load_scenario(SCENARIO)
    staged = staged_load_from_scenario(SCENARIO, steps=STEPS, step_s=STEP_S)
    for stage in staged.stages:
        raw = [sp.arrival_s for sp in _unshaped(scn, stage.load) if sp.arrival_s < STEP_S]
        assert len(set(raw)) < len(raw) / 2  # the trace itself: many requests share each bucket's timestamp
        arrivals = [sp.arrival_s for sp in stage.specs]
        assert len(set(arrivals)) == len(arrivals)  # no two sent in the same instant
        assert arrivals == sorted(arrivals)
        assert all(stage.start_s <= t < stage.start_s + STEP_S for t in arrivals)  # none leak into the next stage
