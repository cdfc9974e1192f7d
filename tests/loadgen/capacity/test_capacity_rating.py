"""The rated capacity's estimate and interval (``loadgen.capacity.rating``, its fits in
``capacity.crossing``): the share of requests over the threshold against load, its isotonic and logistic
fits and their crossing, the profile interval and the bootstrap over windows, cliff against gradual, and
the binding SLO. Steps are built from a known latency curve, so the true crossing is known exactly."""

from __future__ import annotations

import math

import numpy as np
import pytest

from loadgen.capacity import crossing, rating
from loadgen.capacity.crossing import isotonic
from loadgen.capacity.rating import CLIFF_RATIO, MAX_T_SCALE, level_crossing, rate, t_scale
from loadgen.capacity.step_stats import window_records


def test_isotonic_pools_adjacent_violators():
    assert isotonic([1, 3, 2, 4]).tolist() == [1, 2.5, 2.5, 4]
    assert isotonic([1, 3, 2, 4], [1, 3, 1, 1]).tolist() == [1, 2.75, 2.75, 4]
    assert isotonic([3, 2, 1]).tolist() == [2, 2, 2]
    assert isotonic([0, 1, 2]).tolist() == [0, 1, 2]


def test_margin_level_crossing_is_interpolated_in_log_log():
    x = [1.0, 2.0, 4.0, 8.0]
    g = np.log([0.25, 0.5, 2.0, 4.0])
    assert level_crossing(x, g) == pytest.approx(2 * math.sqrt(2))  # halfway from 0.5 to 2 in log
    assert level_crossing(x, g, math.log(0.5)) == pytest.approx(2.0)  # on a point
    assert level_crossing(x, np.log([0.1, 0.2, 0.3, 0.9])) is None and level_crossing(x, np.log([1.1, 2, 3, 4])) is None


def test_exceedance_crossing_pools_windows_and_interpolates():
    x = np.array([10.0, 20.0, 20.0, 40.0])
    over, n = np.array([0.0, 0.0, 20.0, 40.0]), np.array([1000.0, 1000.0, 1000.0, 1000.0])
    # the two windows at 20 pool to 1 %: the crossing of 1 % is at 20 exactly; of 2 %, a third of the way
    # (linear in the share: 1 % to 4 %) from 20 to 40 in log(load)
    assert crossing.exceedance_crossing(x, over, n, 0.01) == (pytest.approx(20.0), None)
    assert crossing.exceedance_crossing(x, over, n, 0.02)[0] == pytest.approx(20.0 * 2 ** (1 / 3))
    # a noisy dip is pooled away: the fit never falls with load
    dip = crossing.exceedance_crossing(np.array([10.0, 20.0, 30.0, 40.0]), np.array([0.0, 30.0, 10.0, 40.0]), n, 0.01)
    assert dip[0] == pytest.approx(10.0 * 2 ** (0.5))  # 10 -> the pooled 2 % at 20 and 30
    assert crossing.exceedance_crossing(x, np.zeros(4), n, 0.01) == (40.0, "above")
    assert crossing.exceedance_crossing(x, np.full(4, 500.0), n, 0.01) == (10.0, "below")


def test_logistic_fit_recovers_its_curve():
    x = np.array([8.2, 9.0, 10.0, 11.0, 12.0])
    a, b = -4.595 - 12.0 * math.log(10.0), 12.0  # 1 % at 10, slope 12 in log load
    p = 1.0 / (1.0 + np.exp(-(a + b * np.log(x))))
    n = np.full(5, 1000.0)
    fa, fb = crossing.logistic_fit(x, n * p, n)
    assert fa == pytest.approx(a, rel=1e-6) and fb == pytest.approx(b, rel=1e-6)
    c, k = crossing.logistic_crossing(x, n * p, n, 1.0 / (1.0 + math.exp(-(a + b * math.log(10.0)))), start=11.0)
    assert c == pytest.approx(10.0, rel=1e-6) and k == 5
    # nothing over the threshold, or a fit that falls with load, cannot stand
    assert crossing.logistic_crossing(x, np.zeros(5), n, 0.01, start=10.0) is None
    assert crossing.logistic_crossing(x, n * p[::-1], n, 0.01, start=10.0) is None


def test_t_scale_widens_few_windows():
    assert t_scale(1, 0.95) == MAX_T_SCALE  # t(1) = 12.7: capped
    assert t_scale(4, 0.95) == pytest.approx(2.776 / 1.960, rel=1e-3)
    assert t_scale(10, 0.95) == pytest.approx(2.228 / 1.960, rel=1e-3)
    assert 1.0 < t_scale(200, 0.95) < 1.01
    assert t_scale(0, 0.95) == MAX_T_SCALE


def curve_steps(loads, k, *, cap=10.0, n=2000, tiers=(("premium", 300.0),), seed=0, shift=None):
    """Steps of a target whose TTFTs are exponential with p99 = threshold * (load / cap) ** k: a step's
    margin is that, and the share of its requests over the threshold is 0.01 ** ((cap / load) ** k),
    drawn binomially; the true crossing is ``cap`` for every tier (``shift`` moves a tier's)."""
    rng = np.random.default_rng(seed)
    steps = []
    for i, load in enumerate(loads):
        tiers_e = {}
        for tier, thr in tiers:
            c = cap * (shift or {}).get(tier, 1.0)
            share = 0.01 ** ((c / load) ** k)
            tiers_e[tier] = {"quantile": 0.99, "judged": {"ttft_ms": {
                "value_ms_q": thr * (load / c) ** k, "threshold_ms": thr, "n": n,
                "over": int(rng.binomial(n, share))}}}
        steps.append({"index": i, "load": load * 1.05, "offered_rps": load, "window_s": [3.0, 13.0],
                      "requests": n * len(tiers), "tiers": tiers_e})
    return steps


LOADS = [4.0, 8.0, 9.0, 9.6, 10.4, 11.0, 12.0, 16.0]


def test_the_estimate_and_interval_hold_the_crossing():
    steps = curve_steps(LOADS, 3)
    r = rate(steps, "rate", n_boot=400, seed=1)
    assert r["of"] == "rate_rps" and r["open"] is None and "profile quasi-likelihood" in r["method"]
    assert r["interval_method"] == "profile" and r["dispersion"] >= 1.0 and r["t_scale"] is None
    assert r["fit"] == "logistic" and r["fit_windows"] >= 4
    assert r["ci_low"] < r["estimate"] < r["ci_high"]
    assert r["ci_low"] < 10.0 < r["ci_high"]  # the truth
    assert r["estimate"] == pytest.approx(10.0, rel=0.05)
    assert (r["ci_high"] - r["ci_low"]) / r["estimate"] < 0.4
    assert rate(steps, "rate", n_boot=400, seed=2) == r | {"seed": 2}  # no resampling: the seed changes nothing
    # the x axis is the offered rate, not the requested load (1.05 x here)
    assert all(c["load"] < 11 for c in r["crossings"])


def binomial_windows() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Six windows of 4,000 requests at each of five loads, each request over the threshold on its own with
    probability 1 % x (load / 10)^12: (loads, over, n), crossing 1 % at 10."""
    loads = np.repeat([9.0, 9.5, 10.0, 10.5, 11.0], 6)
    n = np.full(loads.size, 4000.0)
    over = np.random.default_rng(7).binomial(n.astype(int), 0.01 * (loads / 10.0) ** 12).astype(float)
    return loads, over, n


def test_the_profile_interval_widens_with_the_windows_dispersion():
    """Binomial windows (no runs of exceedances) give a dispersion near 1; the same windows with their
    counts scattered as runs scatter them (each window's count times 0 or 2, the same mean) give a larger
    one and a wider interval around the same crossing."""
    loads, over, n = binomial_windows()
    rng = np.random.default_rng(8)
    first = crossing.profile_interval(loads, over, n, 0.01, 10.0, 0.95)
    lo, hi, phi = first.low, first.high, first.dispersion
    assert lo < 10.0 < hi and 1.0 <= phi < 2.0 and first.unbounded == ()
    runs = over * rng.choice([0.0, 2.0], loads.size)
    est, _o, _k = crossing.slo_crossing(loads, runs, n, 0.01)
    wide = crossing.profile_interval(loads, runs, n, 0.01, est, 0.95)
    lo2, hi2, phi2 = wide.low, wide.high, wide.dispersion
    assert phi2 > 3.0 and hi2 - lo2 > 1.5 * (hi - lo)
    assert crossing.profile_interval(loads[:2], over[:2], n[:2], 0.01, 10.0, 0.95) is None  # too few windows
    assert crossing.profile_interval(loads, np.zeros(loads.size), n, 0.01, 10.0, 0.95) is None  # nothing over


def test_an_end_the_windows_cannot_bound_is_marked_unbounded_not_clamped():
    """Windows that barely tell the loads apart (a shallow rise, few requests, exceedances in long runs):
    the deviance never rises past the critical value within ``MAX_REACH``, so that end is named unbounded
    and sits at the reach; a sharp knee measured with many binomial requests is bounded on both sides,
    and a shallower one is bounded beyond the first widening step (the search is not clamped to it)."""
    loads = np.repeat([9.0, 10.0, 11.0], 2)
    n = np.full(loads.size, 200.0)
    over = np.array([1.0, 2.0, 2.0, 3.0, 3.0, 4.0])
    vague = crossing.profile_interval(loads, over, n, 0.01, 10.0, 0.95, runs=over / 2.0)
    assert "high" in vague.unbounded
    assert vague.high == pytest.approx(10.0 * crossing.MAX_REACH)
    loads, over, n = binomial_windows()
    sharp = crossing.profile_interval(loads, over, n, 0.01, 10.0, 0.95)
    assert sharp.unbounded == () and sharp.high < 10.0 * crossing.PROFILE_STEP
    loads = np.repeat([8.5, 9.0, 9.5, 10.0, 10.5, 11.0, 11.5, 12.0], 3)  # a shallower knee, runs of 5
    n = np.full(loads.size, 400.0)
    over = np.random.default_rng(3).binomial(400, np.minimum(0.5, 0.01 * (loads / 10.0) ** 4)).astype(float)
    est, _o, _k = crossing.slo_crossing(loads, over, n, 0.01)
    widened = crossing.profile_interval(loads, over, n, 0.01, est, 0.95, runs=over / 5.0)
    assert widened.unbounded == () and widened.low < est / crossing.PROFILE_STEP


def test_the_windows_mean_run_of_exceedances_is_a_floor_under_the_dispersion():
    """The same binomial windows (Pearson's dispersion near 1), told that their exceedances came in runs of
    ten: the dispersion is at least 10 and the interval wider; runs of one, or runs not counted (NaN, a
    summary from before steps counted them), leave it as it was."""
    loads, over, n = binomial_windows()
    plain = crossing.profile_interval(loads, over, n, 0.01, 10.0, 0.95)
    runs = crossing.profile_interval(loads, over, n, 0.01, 10.0, 0.95, runs=over / 10.0)
    assert runs.dispersion == pytest.approx(10.0) and plain.dispersion < 2.0
    assert runs.low < plain.low and runs.high > plain.high
    assert crossing.profile_interval(loads, over, n, 0.01, 10.0, 0.95, runs=over) == plain
    assert crossing.profile_interval(loads, over, n, 0.01, 10.0, 0.95, runs=np.full(loads.size, np.nan)) == plain


def test_without_a_logistic_fit_the_interval_is_a_seeded_bootstrap_of_the_windows():
    """Where no logistic fit stands (here: exceedances at one load only) the interval falls back to the
    bootstrap of the windows, seeded: the same run gives the same interval."""
    steps = curve_steps([6.0, 8.0, 16.0, 16.0], 3)
    r = rate(steps, n_boot=200, seed=1)
    assert r["fit"] == "isotonic" and r["interval_method"] == "bootstrap" and "bootstrap (200)" in r["method"]
    assert r["dispersion"] is None and r["t_scale"] >= 1.0
    assert rate(steps, n_boot=200, seed=1) == r


def test_a_window_that_met_a_burst_widens_the_interval():
    """The same design twice, once with one window near the knee that met a burst (a run of refusals:
    10 % of its requests): the estimate moves down and the interval reaches lower, because windows,
    not requests, are resampled."""
    calm = curve_steps(LOADS, 3, seed=4)
    burst = curve_steps(LOADS, 3, seed=4)
    burst[3]["tiers"]["premium"]["judged"]["ttft_ms"]["over"] = 200  # 9.6 req/s: 10 % over
    r_calm, r_burst = rate(calm, n_boot=400), rate(burst, n_boot=400)
    assert r_burst["estimate"] < r_calm["estimate"]
    assert r_burst["ci_low"] < r_calm["ci_low"]


def test_without_counts_a_step_says_nothing():
    steps = curve_steps(LOADS, 3)
    for st in steps:  # a summary from before steps counted their exceedances
        del st["tiers"]["premium"]["judged"]["ttft_ms"]["over"]
    assert rate(steps, n_boot=50) is None


def test_cliff_and_gradual():
    sharp = rate(curve_steps(LOADS, 8), n_boot=50)
    soft = rate(curve_steps(LOADS, 1.5), n_boot=50)
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
    steps = curve_steps(LOADS, 3, tiers=tiers, shift={"standard": 1.3})
    r = rate(steps, n_boot=50)
    assert r["binding"] == {"tier": "premium", "metric": "ttft_ms"}
    by = {c["tier"]: c["load"] for c in r["crossings"]}
    assert by["premium"] == pytest.approx(r["estimate"]) and by["standard"] > 12
    steps = curve_steps(LOADS, 3, tiers=tiers, shift={"premium": 1.3, "standard": 0.9})
    assert rate(steps, n_boot=50)["binding"] == {"tier": "standard", "metric": "ttft_ms"}


def test_open_ends_and_nothing_judged():
    r = rate(curve_steps([2.0, 4.0, 6.0], 3), n_boot=50)
    assert r["open"] == "above" and r["estimate"] == 6.0 and r["boundary"] is None and r["fit"] == "isotonic"
    assert rate([{"index": 0, "load": 1, "tiers": {"basic": {"judged": {}}}}]) is None
    # a re-measured (uncounted) step is left out; concurrency places steps at their users
    steps = curve_steps(LOADS, 3)
    steps[3]["counted"] = False
    c = rate(steps, "concurrency", n_boot=50)
    assert c["of"] == "concurrency" and c["estimate"] == pytest.approx(10.0 * 1.05, rel=0.1)
    assert c["windows"] == len(LOADS) - 1


def test_a_step_is_placed_at_its_planned_rate_not_at_what_it_sent_before_a_breach():
    steps = curve_steps(LOADS, 8)
    sent_in_burst = [dict(st) for st in steps]
    for st in sent_in_burst:  # failing steps stopped in a burst: what they sent runs 30 % above their load
        if st["offered_rps"] > 10.0:
            st["planned_rps"], st["offered_rps"] = st["offered_rps"], st["offered_rps"] * 1.3
    placed = rate(sent_in_burst, n_boot=50)
    assert placed["estimate"] == pytest.approx(rate(steps, n_boot=50)["estimate"])
    assert placed["cliff_gap"] == [9.6, 10.4]
    without = [{k: v for k, v in st.items() if k != "planned_rps"} for st in sent_in_burst]
    assert rate(without, n_boot=50)["estimate"] > placed["estimate"]  # the bias planned_rps removes


def test_windows_near_the_estimate_are_resampled_among_themselves():
    from loadgen.capacity.rating import _resample_windows

    loads = np.array([4.0, 8.0, 9.0, 10.0, 11.0, 16.0, 32.0])
    picks = _resample_windows(loads, 10.0, 500, np.random.default_rng(0))
    near = [1, 2, 3, 4]  # 8.0 .. 12.5
    assert (picks[:, near].sum(axis=1) == 4).all() and (picks[:, near] == 0).any()
    assert (picks.sum(axis=1) == len(loads)).all()


def test_planned_rate_counts_the_whole_planned_window():
    from loadgen.capacity.step_stats import StepWindow

    st = StepWindow(0, 10.0, "bisect", start_s=0.0, w0=3.0, w1=13.0)
    assert st.planned_rps() is None  # closed loop: no schedule
    st.arrivals = [0.5, 2.9] + [3.0 + 0.1 * i for i in range(100)] + [13.0, 14.0]
    st.stopped_at = 4.0  # an early stop does not change what the step's draw was going to offer
    assert st.planned_rps() == pytest.approx(10.0)


def test_window_records_are_the_stage_s_requests_inside_its_window():
    steps = [{"index": 0, "window_s": [3.0, 13.0]}, {"index": 1, "window_s": [20.0, 30.0]}]
    recs = [{"stage": 0, "scheduled_s": 2.9}, {"stage": 0, "scheduled_s": 3.0}, {"stage": 0, "scheduled_s": 13.0},
            {"stage": 1, "scheduled_s": 25.0}, {"stage": 2, "scheduled_s": 25.0}]
    w = window_records(steps, recs)
    assert w == {0: [recs[1]], 1: [recs[3]]}


def test_a_wide_gap_below_the_first_exceedances_does_not_drag_the_crossing_down():
    """Windows with no exceedance far below (the ramp's 2 and 4) and the knee's windows all just over 1 %:
    the isotonic crossing interpolates linearly across the gap, far too low; the logistic fit, started from
    one over every window, places it where the curve is."""
    loads = [2.0, 4.0, 9.8, 10.2, 10.6, 11.0]
    b = 20.0
    a = math.log(0.01 / 0.99) - b * math.log(9.5)  # the true crossing: 9.5
    steps = []
    for i, x in enumerate(loads):
        p = 1.0 / (1.0 + math.exp(-(a + b * math.log(x))))
        steps.append({"index": i, "load": x, "tiers": {"premium": {"quantile": 0.99, "judged": {"ttft_ms": {
            "value_ms_q": 300.0 * (x / 9.5) ** 4, "threshold_ms": 300.0, "n": 100000, "over": round(100000 * p)}}}}})
    over = np.asarray([s["tiers"]["premium"]["judged"]["ttft_ms"]["over"] for s in steps], dtype=float)
    iso, _ = crossing.exceedance_crossing(np.asarray(loads), over, np.full(len(loads), 100000.0), 0.01)
    assert iso < 8.0  # the gap's linear interpolation
    r = rate(steps, n_boot=50)
    assert r["fit"] == "logistic" and r["estimate"] == pytest.approx(9.5, rel=0.01)


def test_estimate_alone_is_the_rating_s_estimate_and_none_without_a_crossing():
    """``rating.estimate`` (where the search's refine windows go) is ``rate``'s estimate without the
    interval, over every tier; None when the steps do not cross the SLO or judge nothing."""
    steps = curve_steps(LOADS, 3, tiers=(("premium", 300.0), ("standard", 800.0)), shift={"standard": 0.9})
    assert rating.estimate(steps) == rate(steps, n_boot=20)["estimate"] == pytest.approx(9.0, rel=0.05)
    assert rating.estimate(steps, "concurrency") == rate(steps, "concurrency", n_boot=20)["estimate"]
    assert rating.estimate(curve_steps([2.0, 4.0, 6.0], 3)) is None  # open above: no crossing to aim at
    assert rating.estimate([{"index": 0, "load": 1, "tiers": {"basic": {"judged": {}}}}]) is None


def test_an_slo_without_a_profile_that_crosses_far_above_leaves_the_profile_interval_standing():
    """Two tiers: premium crosses at 10 with a logistic fit; standard's crossing lies above every load
    tried (open above, no fit). The rating's interval is premium's profile interval; were the unfitted SLO
    near the binding one, the bootstrap would stand in."""
    tiers = (("premium", 300.0), ("standard", 800.0))
    r = rate(curve_steps(LOADS, 3, tiers=tiers, shift={"standard": 3.0}), n_boot=50)
    assert r["binding"] == {"tier": "premium", "metric": "ttft_ms"}
    assert r["interval_method"] == "profile" and r["ci_low"] < 10.0 < r["ci_high"]
    assert {c["tier"]: c["open"] for c in r["crossings"]} == {"premium": None, "standard": "above"}


def test_an_unbounded_end_is_said_unbounded_and_not_gated_on():
    """The console, the verdict and the report print the word where an end is unbounded (never the reach
    as a bound), and the gate's interval rule does not use such an interval (it falls back to the ratio)."""
    from loadgen.capacity.headline import interval_span
    from loadgen.gate.lookup import interval

    rated = {"estimate": 33.0, "ci_low": 8.25, "ci_high": 36.1, "ci_unbounded": ["low"], "ci_of": "rate_rps"}
    assert interval_span(rated) == "unbounded–36.1"
    assert interval_span({**rated, "ci_unbounded": []}) == "8.25–36.1"
    assert interval({"rated_capacity": rated}, "rated_capacity.rate_rps") is None
    assert interval({"rated_capacity": {**rated, "ci_unbounded": []}}, "rated_capacity.rate_rps") == (33.0, 8.25, 36.1)
