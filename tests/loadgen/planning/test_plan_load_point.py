"""The load point's fit: the scale of the step model at which the simulation's service times equal the
measured ones, found on requests whose true scale is known."""

from __future__ import annotations

import numpy as np
import pytest

from loadgen.planning.load_point import FACTOR_BOUNDS, fit_factor, scaled, service_s, simulated_s
from loadgen.planning.requests import requests_of
from loadgen.planning.simulate import EngineShape
from loadgen.planning.step_model import LinearStep
from loadgen.scenario.parse import load_scenario
from loadgen.scenario.steps import step_specs

MODEL = LinearStep(const_s=2e-3, per_seq_s=1e-4, per_token_s=6e-5, per_pair_s=1e-7)
ENGINE = EngineShape(max_num_seqs=64, tier_ttft_slo_ms={"premium": 300.0, "standard": 800.0})


@pytest.fixture(scope="module")
def requests():
    scn = load_scenario("loadgen/scenarios/chat.yaml", [])
    return requests_of(step_specs(scn, "rate", 30.0, 0, 0.0, 20.0, draw=1))


@pytest.mark.parametrize("truth", [0.8, 1.3])
def test_the_fit_recovers_a_known_scale(requests, truth):
    measured = simulated_s(requests, ENGINE, scaled(MODEL, truth), server=True)  # a target exactly truth x slower
    factor, at_one, at_fit, _, n = fit_factor(requests, measured, ENGINE, MODEL, server=True)
    assert factor == pytest.approx(truth, rel=0.01)
    assert at_fit == pytest.approx(float(np.nanmean(measured)), rel=0.01)
    assert (at_one < at_fit) == (truth > 1) and n > 0.9 * len(requests)


def test_the_fit_is_clamped_to_its_bounds(requests):
    measured = simulated_s(requests, ENGINE, MODEL, server=True)
    assert fit_factor(requests, measured * 100, ENGINE, MODEL, server=True)[0] == FACTOR_BOUNDS[1]
    assert fit_factor(requests, measured / 100, ENGINE, MODEL, server=True)[0] == FACTOR_BOUNDS[0]


def test_scaling_multiplies_every_step():
    assert scaled(MODEL, 1.5).step_s(8, 100, 800, 5000) == pytest.approx(1.5 * MODEL.step_s(8, 100, 800, 5000))


def test_service_times_come_from_the_servers_timing_else_the_clients():
    recs = [{"id": "a", "status": "ok", "server": {"queue_ms": 5.0, "prefill_ms": 10.0, "decode_ms": 90.0},
             "scheduled_s": 0.0, "done_s": 0.2},
            {"id": "b", "status": "rejected", "server": None}]
    got, src = service_s(recs, ["a", "b", "c"])
    assert src == "server timing" and got[0] == pytest.approx(0.1) and np.isnan(got[1:]).all()
    recs = [{"id": "a", "status": "ok", "server": None, "scheduled_s": 1.0, "first_token_s": 1.05, "done_s": 1.25,
             "token_s": [1.05, 1.25]}]
    got, src = service_s(recs, ["a"])
    assert src == "client timing" and got[0] == pytest.approx(0.25)
