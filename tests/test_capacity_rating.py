"""The rated capacity's confidence interval (``loadgen.capacity.rating``): the isotonic fit, its
crossing, the bootstrap over each step's requests, cliff against gradual, and the binding SLO. Steps
and records are built from a known latency curve, so the true crossing is known exactly."""

from __future__ import annotations

import math

import numpy as np
import pytest

from loadgen.capacity.rating import CLIFF_RATIO, crossing, isotonic, level_crossing, rate, window_records
from loadgen.results.latency import quantile
from loadgen.results.slo import SLO, judge


def test_isotonic_pools_adjacent_violators():
    assert isotonic([1, 3, 2, 4]).tolist() == [1, 2.5, 2.5, 4]
    assert isotonic([1, 3, 2, 4], [1, 3, 1, 1]).tolist() == [1, 2.75, 2.75, 4]
    assert isotonic([3, 2, 1]).tolist() == [2, 2, 2]
    assert isotonic([0, 1, 2]).tolist() == [0, 1, 2]


def test_crossing_is_interpolated_in_log_log():
    x = [1.0, 2.0, 4.0, 8.0]
    lm = np.log([0.25, 0.5, 2.0, 4.0])
    c, open_end = crossing(x, lm, [1, 1, 1, 1])
    assert open_end is None and c == pytest.approx(2 * math.sqrt(2))  # halfway from 0.5 to 2 in log
    # a noisy dip above the crossing is pooled (2.0 and 1.5 -> their geometric mean): the fit stays monotone
    c2, _ = crossing(x + [16.0], np.log([0.25, 0.5, 2.0, 1.5, 4.0]), [1] * 5)
    t = math.log(2) / (math.log(math.sqrt(3.0)) + math.log(2))
    assert c2 == pytest.approx(math.exp(math.log(2) + t * math.log(2)))
    assert crossing(x, np.log([0.1, 0.2, 0.3, 0.9]), [1] * 4) == (8.0, "above")
    assert crossing(x, np.log([1.1, 2, 3, 4]), [1] * 4) == (1.0, "below")
    assert level_crossing(x, np.log([0.25, 0.5, 2.0, 4.0]), math.log(0.5)) == pytest.approx(2.0)  # on a point


def curve_steps(loads, k, *, cap=10.0, n=400, tiers=(("premium", 300.0),), seed=0, shift=None):
    """Steps and records of a target whose p99 TTFT is threshold * (load / cap) ** k: TTFTs are exponential
    with that p99, so the true crossing of margin 1 is ``cap`` for every tier (``shift`` moves a tier's)."""
    rng = np.random.default_rng(seed)
    steps, records = [], []
    for i, load in enumerate(loads):
        tiers_e = {}
        for tier, thr in tiers:
            c = cap * (shift or {}).get(tier, 1.0)
            p99 = thr * (load / c) ** k
            v = rng.exponential(p99 / math.log(100), n)
            recs = [{"stage": i, "tier": tier, "scheduled_s": 3.0 + t, "sent_s": 3.0 + t,
                     "first_token_s": 3.0 + t + ms / 1000, "done_s": 3.0 + t + ms / 1000 + 0.01, "status": "ok",
                     "token_s": [3.0 + t + ms / 1000]} for t, ms in zip(np.linspace(0, 9.99, n), v, strict=True)]
            records += recs
            j = judge(v, SLO("ttft_ms", thr, 0.99), seed=i)
            tiers_e[tier] = {"quantile": 0.99, "judged": {"ttft_ms": {
                "value_ms_q": j.value_ms, "ci_low_ms": j.ci_low_ms, "ci_high_ms": j.ci_high_ms, "threshold_ms": thr,
                "passed": j.passed, "n": j.n}}}
        steps.append({"index": i, "load": load * 1.05, "offered_rps": load, "window_s": [3.0, 13.0],
                      "requests": n * len(tiers), "tiers": tiers_e})
    return steps, records


LOADS = [4.0, 8.0, 9.0, 9.6, 10.4, 11.0, 12.0, 16.0]


def test_bootstrap_interval_contains_the_crossing_and_is_seeded():
    steps, records = curve_steps(LOADS, 3)
    recs = window_records(steps, records)
    r = rate(steps, "rate", recs, n_boot=400, seed=1)
    assert r["of"] == "rate_rps" and r["open"] is None and "each step's requests" in r["method"]
    assert r["ci_low"] < r["estimate"] < r["ci_high"]
    assert r["ci_low"] < 10.0 < r["ci_high"]  # the truth
    assert r["estimate"] == pytest.approx(10.0, rel=0.08)
    assert 0.02 < (r["ci_high"] - r["ci_low"]) / r["estimate"] < 0.4
    assert rate(steps, "rate", recs, n_boot=400, seed=1) == r  # reproducible
    assert rate(steps, "rate", recs, n_boot=400, seed=2)["ci_low"] != r["ci_low"]
    # the x axis is the offered rate, not the requested load (1.05 x here)
    assert all(c["load"] < 11 for c in r["crossings"])
    # without records each step varies within its own quantile interval instead
    alone = rate(steps, "rate", None, n_boot=400, seed=1)
    assert alone["estimate"] == r["estimate"] and "quantile interval" in alone["method"]
    assert alone["ci_low"] < 10.0 < alone["ci_high"]


def test_the_estimate_is_the_steps_own_quantiles():
    steps, records = curve_steps(LOADS, 3, seed=5)
    recs = window_records(steps, records)
    for st in steps:  # the records rebuild each step's judgement exactly
        v = [(r["first_token_s"] - r["scheduled_s"]) * 1000 for r in recs[st["index"]]]
        assert quantile(v, 0.99) == pytest.approx(st["tiers"]["premium"]["judged"]["ttft_ms"]["value_ms_q"])


def test_cliff_and_gradual():
    sharp = rate(*curve_steps(LOADS, 8)[:1], n_boot=50)
    soft = rate(*curve_steps(LOADS, 1.5)[:1], n_boot=50)
    assert sharp["boundary"] == "cliff" and sharp["margin_load_ratio"] <= CLIFF_RATIO
    assert soft["boundary"] == "gradual" and soft["margin_load_ratio"] > CLIFF_RATIO
    # the true ratios: (1.2 / 0.8) ** (1 / k)
    assert sharp["margin_load_ratio"] == pytest.approx(1.5 ** (1 / 8), rel=0.04)
    # a cliff's interval spans the gap between the last passing and the first failing load (9.6 and 10.4)
    assert sharp["cliff_gap"] == [9.6, 10.4] and soft["cliff_gap"] is None
    assert sharp["ci_low"] <= 9.6 and sharp["ci_high"] >= 10.4
    assert soft["margin_load_ratio"] == pytest.approx(1.5 ** (1 / 1.5), rel=0.1)


def test_binding_names_the_slo_that_breaks_first():
    tiers = (("premium", 300.0), ("standard", 800.0))
    steps, _ = curve_steps(LOADS, 3, tiers=tiers, shift={"standard": 1.3})
    r = rate(steps, n_boot=50)
    assert r["binding"] == {"tier": "premium", "metric": "ttft_ms"}
    by = {c["tier"]: c["load"] for c in r["crossings"]}
    assert by["premium"] == pytest.approx(r["estimate"]) and by["standard"] > 12
    steps, _ = curve_steps(LOADS, 3, tiers=tiers, shift={"premium": 1.3, "standard": 0.9})
    assert rate(steps, n_boot=50)["binding"] == {"tier": "standard", "metric": "ttft_ms"}


def test_open_ends_and_nothing_judged():
    steps, _ = curve_steps([2.0, 4.0, 6.0], 3)
    r = rate(steps, n_boot=50)
    assert r["open"] == "above" and r["estimate"] == 6.0 and r["boundary"] is None
    assert rate([{"index": 0, "load": 1, "tiers": {"basic": {"judged": {}}}}]) is None
    # a re-measured (uncounted) step is left out; concurrency places steps at their users
    steps, _ = curve_steps(LOADS, 3)
    steps[3]["counted"] = False
    c = rate(steps, "concurrency", n_boot=50)
    assert c["of"] == "concurrency" and c["estimate"] == pytest.approx(10.0 * 1.05, rel=0.1)


def test_a_step_is_placed_at_its_planned_rate_not_at_what_it_sent_before_a_breach():
    steps, _ = curve_steps(LOADS, 8)
    sent_in_burst = [dict(st) for st in steps]
    for st in sent_in_burst:  # failing steps stopped in a burst: what they sent runs 30 % above their load
        if st["offered_rps"] > 10.0:
            st["planned_rps"], st["offered_rps"] = st["offered_rps"], st["offered_rps"] * 1.3
    placed = rate(sent_in_burst, n_boot=50)
    assert placed["estimate"] == pytest.approx(rate(steps, n_boot=50)["estimate"])
    assert placed["cliff_gap"] == [9.6, 10.4]
    without = [{k: v for k, v in st.items() if k != "planned_rps"} for st in sent_in_burst]
    biased = rate(without, n_boot=50)  # the bias planned_rps removes: the crossing moves up into the gap
    assert biased["estimate"] > 1.1 * placed["estimate"] and biased["boundary"] == "gradual"


def test_planned_rate_counts_the_whole_planned_window():
    from loadgen.capacity.step_stats import StepWindow

    st = StepWindow(0, 10.0, "bisect", start_s=0.0, w0=3.0, w1=13.0)
    assert st.planned_rps() is None  # closed loop: no schedule
    st.arrivals = [0.5, 2.9] + [3.0 + 0.1 * i for i in range(100)] + [13.0, 14.0]
    st.stopped_at = 4.0  # an early stop does not change what the step's draw was going to offer
    assert st.planned_rps() == pytest.approx(10.0)


def test_windows_that_asked_for_one_load_are_resampled_among_themselves():
    from loadgen.capacity.rating import _resample_windows

    picks, column = _resample_windows({0: 4.0, 1: 8.0, 2: 8.0, 3: 8.0, 5: 16.0}, 500, np.random.default_rng(0))
    assert column == {0: 0, 1: 1, 2: 2, 3: 3, 5: 4}
    assert (picks[:, [0, 4]] == 1).all()  # a load measured once keeps its one window
    assert (picks[:, 1:4].sum(axis=1) == 3).all() and (picks[:, 1:4] == 0).any()  # the repeats: drawn among them
    unnamed, _ = _resample_windows({0: None, 1: None, 2: 8.0}, 200, np.random.default_rng(0))
    assert (unnamed == 1).all()  # steps that name no load are not one load


def test_a_bracket_end_whose_windows_disagree_widens_the_interval_below_it():
    """At 10 req/s three windows pass and one (a confirmation on another draw) met a burst: the fit at 10
    still passes, and the request-level bootstrap alone keeps it a pass in every replicate; resampling
    the windows measured at 10 does not (a replicate that drew the burst twice fails there)."""
    steps, _ = curve_steps([6.0, 8.0, 10.0, 10.0, 10.0, 10.0, 11.0, 12.0], 8, cap=10.5)
    burst = steps[3]["tiers"]["premium"]["judged"]["ttft_ms"]
    burst.update(value_ms_q=600.0, ci_low_ms=560.0, ci_high_ms=640.0, passed=False)  # margin 2
    for st in steps:
        st["load"] = round(st["offered_rps"])  # what each step asked for: the four at 10 are one load
    r = rate(steps, n_boot=400, seed=3)
    assert r["estimate"] > 10.0 and r["ci_low"] < 9.9
    agree = [st for i, st in enumerate(steps) if i != 3]
    assert rate(agree, n_boot=400, seed=3)["ci_low"] >= 10.0
