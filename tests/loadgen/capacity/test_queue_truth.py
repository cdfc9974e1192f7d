"""The queue simulation behind ``slobench calibrate`` (loadgen/capacity/truth.py) against queueing theory
where it is known exactly: D/D/1 and D/D/c (no wait below capacity), M/D/1 (Pollaczek-Khinchine), M/M/c
(Erlang C), saturation at c/S; and the p99 curve it bisects is monotone."""

from __future__ import annotations

import math

import numpy as np
import pytest

from loadgen.capacity.truth import QueueParams, QueueTruth, TruthError, check_scenario, fifo_waits, latencies
from loadgen.scenario.parse import load_scenario
from tests.helpers import REPO


def poisson(rate: float, n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).exponential(1.0 / rate, n).cumsum()


def test_dd1_and_ddc_never_wait_below_capacity_and_wait_linearly_above():
    s = 0.1
    below = np.arange(1000) * (s * 1.01)  # one arrival every 1.01 S: the server is always free
    assert np.all(fifo_waits(below, np.full(1000, s), 1) == 0)
    ddc = np.arange(1000) * (s / 4 * 1.01)  # 4 slots, arrivals 1.01 S / 4 apart
    assert np.all(fifo_waits(ddc, np.full(1000, s), 4) == 0)
    above = np.arange(100) * (s / 2)  # twice the capacity: request k waits k x S/2
    assert fifo_waits(above, np.full(100, s), 1) == pytest.approx(np.arange(100) * s / 2)


def test_a_burst_of_2c_waits_one_service_time_for_the_second_half():
    w = fifo_waits(np.zeros(8), np.full(8, 0.07), 4)
    assert list(w) == [0, 0, 0, 0, 0.07, 0.07, 0.07, 0.07]


def test_md1_mean_wait_is_pollaczek_khinchine():
    s, rho = 0.05, 0.7
    waits = np.concatenate([fifo_waits(a, np.full(a.size, s), 1)[5000:]
                            for a in (poisson(rho / s, 100_000, seed) for seed in range(4))])
    expect = rho * s / (2 * (1 - rho))  # M/D/1: W = rho S / (2 (1 - rho))
    assert waits.mean() == pytest.approx(expect, rel=0.04)


def test_mmc_mean_wait_is_erlang_c():
    c, mu, rho = 3, 10.0, 0.75
    lam = rho * c * mu
    a = c * rho
    tail = a**c / math.factorial(c) / (1 - rho)
    erlang_c = tail / (sum(a**k / math.factorial(k) for k in range(c)) + tail)
    expect = erlang_c / (c * mu - lam)
    waits = []
    for seed in range(4):
        rng = np.random.default_rng(100 + seed)
        arr = poisson(lam, 100_000, seed)
        waits.append(fifo_waits(arr, rng.exponential(1 / mu, arr.size), c)[5000:])
    assert np.concatenate(waits).mean() == pytest.approx(expect, rel=0.05)


def test_c_slots_saturate_at_c_over_s():
    c, s, n = 8, 0.4, 20_000
    arr = poisson(3 * c / s, n, 0)  # three times what the slots can serve
    start = arr + fifo_waits(arr, np.full(n, s), c)
    assert (n - 1000) / (start[-1] - start[999]) == pytest.approx(c / s, rel=0.01)


def test_latencies_of_the_mock_schedule():
    q = QueueParams(slots=1, ttft_ms=10, prefill_ms_per_token=0.5, itl_ms=5)
    lat = latencies(np.array([0.0, 0.0]), np.array([20.0, 40.0]), np.array([3.0, 1.0]), q)
    # first: prefill 10 + 10 = 20 ms, holds the slot 20 + 2 x 5 = 30 ms; second waits 30, prefill 30
    assert list(lat["wait_ms"]) == pytest.approx([0, 30])
    assert list(lat["ttft_ms"]) == pytest.approx([20, 60])
    assert list(lat["e2el_ms"]) == pytest.approx([30, 60])
    assert lat["tpot_ms"][0] == 5 and math.isnan(lat["tpot_ms"][1])


@pytest.fixture(scope="module")
def truth():
    scn = load_scenario(REPO / "loadgen" / "scenarios" / "calibrate.yaml")
    return QueueTruth(scn, QueueParams(), requests=8000, seeds=2)


def test_the_p99_curve_is_monotone_and_the_capacity_is_its_crossing(truth):
    rates = np.linspace(0.2, 1.05, 30) * truth.saturation_rps
    p99 = [truth.quantiles(r)["standard"]["ttft_ms"] for r in rates]
    assert all(b >= a for a, b in zip(p99, p99[1:], strict=False))
    assert p99[0] == pytest.approx(20 + 0.1 * 256)  # no queue at a fifth of saturation: TTFT = prefill
    cap = truth.capacity()
    assert 20 < cap < 40  # the default calibration: ~32 req/s, 70% of the 46 req/s saturation
    assert truth.margin(cap) <= 1.0 < truth.margin(cap * 1.001)


def test_the_scenarios_the_simulation_cannot_stand_for(tmp_path):
    base = "name: x\nworkload: {input_len: 8, output_len: 4}\ntiers: {standard: {slo: {ttft_ms: 100}}}\n"
    bad = {"conversations": base.replace("output_len: 4", "output_len: 4, conversations: {turns: 2}")
           + "search: {start: 2}\n",
           "open-loop": base + "load: {arrival: closed, concurrency: 2, requests: 10}\nsearch: {axis: concurrency}\n",
           "completions": base + "search: {start: 2}\nclient: {endpoint: chat}\n"}
    for want, text in bad.items():
        p = tmp_path / "s.yaml"
        p.write_text(text)
        with pytest.raises(TruthError, match=want):
            check_scenario(load_scenario(p))
