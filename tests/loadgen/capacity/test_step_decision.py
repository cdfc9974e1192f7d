"""What decides a capacity step, without a server: the warm-up until the in-flight count stops rising, the
sequential test's boundaries and its error rate at the threshold (simulated), the looks of a step's
window over records, and the step detail's decision fields."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

from loadgen.capacity.early_stop import StepLooks
from loadgen.capacity.settings import CapacitySettings
from loadgen.capacity.steady import SteadyState, steady_time, trending
from loadgen.capacity.step import record_decision
from loadgen.capacity.step_stats import StepWindow, disturbance_of, step_detail
from loadgen.results.records import RequestRecord
from loadgen.results.sequential import SPENDING, SequentialTest, binom_pmf, spent
from loadgen.scenario.model import ScenarioError
from loadgen.scenario.parse import load_scenario

# ------------------------------------------------------------------ steady state


def test_warm_up_lasts_while_the_in_flight_count_rises_then_ends():
    dt = 0.1
    ramp = [min(40.0, 8.0 * i * dt) for i in range(1, 200)]  # rises 8 requests/s to 40 (5 s), then flat
    end, settled = steady_time(ramp, dt, floor_s=1.0, cap_s=12.0)
    assert settled is True and 5.0 < end <= 7.5  # one interval after the plateau's first full second
    flat = [10.0 + (i % 3) for i in range(200)]  # noisy but flat: the floor is enough
    assert steady_time(flat, dt, floor_s=3.0, cap_s=12.0) == (pytest.approx(3.0), True)
    runaway = [5.0 * i * dt for i in range(1, 200)]  # a queue that never settles: the cap, and it says so
    assert steady_time(runaway, dt, floor_s=1.0, cap_s=6.0) == (pytest.approx(6.0), False)
    ss = SteadyState(2.0, 6.0)  # a driver that does not count in-flight requests: the floor, not measured
    assert not ss.check(1.9) and ss.check(2.0) and ss.done_at == 2.0 and ss.settled is None
    assert not trending([10] * 10, [11.5] * 10, 0.1) and trending([10] * 10, [12.5] * 10, 0.1)


# ------------------------------------------------------------------ the sequential test


@pytest.mark.parametrize("kind", SPENDING)
def test_spending_is_monotone_and_spends_alpha_by_the_end(kind):
    ts = np.linspace(0, 1, 41)
    a = [spent(kind, 0.05, t) for t in ts]
    assert a[0] == 0 and a[-1] == pytest.approx(0.05) and all(x <= y + 1e-15 for x, y in zip(a, a[1:], strict=False))


def test_binomial_pmf():
    p = binom_pmf(50, 0.01)
    assert p.sum() == pytest.approx(1) and p[0] == pytest.approx(0.99**50)
    assert p[1] == pytest.approx(50 * 0.01 * 0.99**49)


@pytest.mark.parametrize("kind", SPENDING)
def test_boundaries_are_monotone_and_spend_at_most_alpha(kind):
    """Looks every 0.5 s over a 17 s window at ~24 settled requests/s: the upper boundary, as a share of
    the settled requests, tightens towards 1 % as they accumulate (within one request of discreteness),
    the lower one never falls, and the probability of having crossed either, computed exactly, stays
    within A(t) and so within alpha."""
    ts = SequentialTest(0.99, 0.05, kind)
    looks = 35
    for k in range(1, looks + 1):
        ts.look(k / looks, 12 * k, 0)  # no request ever over: a pass is reached, looks go on for the bounds
        assert ts.spent_up <= spent(kind, 0.05, k / looks) + 1e-12
        assert ts.spent_lo <= spent(kind, 0.05, k / looks) + 1e-12
    ups = [(n, h) for n, _, h in ts.bounds if h is not None]
    assert len(ups) >= looks - 2
    assert all((h2 - 1) / n2 <= h1 / n1 for (n1, h1), (n2, h2) in zip(ups, ups[1:], strict=False))
    assert ups[-1][1] / ups[-1][0] < 0.03 and all(h > 0.01 * n for n, h in ups)
    lows = [lo for _, lo, _ in ts.bounds if lo is not None]
    assert lows and all(a <= b for a, b in zip(lows, lows[1:], strict=False))
    assert all(lo is None or lo < 0.01 * n for n, lo, _ in ts.bounds)
    assert ts.spent_up <= 0.05 + 1e-12 and ts.spent_lo <= 0.05 + 1e-12
    assert ts.decision == "pass" and ts.samples >= 300  # a p99 needs some 300 requests with none over


def simulate(steps: int, rate: float, window_s: float, thr_s: float, tail: float, kind: str, seed: int) -> float:
    """Steps whose requests are over the threshold with probability ``tail`` (i.i.d., Poisson arrivals),
    looked at as the step does: every 0.5 s on the requests scheduled at least a threshold ago, then
    once on the whole window. The share of steps the test calls a breach."""
    rng = np.random.default_rng(seed)
    breaches = 0
    span = window_s + thr_s
    for _ in range(steps):
        n = rng.poisson(rate * window_s)
        sched = np.sort(rng.random(n) * window_s)
        over = rng.random(n) < tail
        ts = SequentialTest(0.99, 0.05, kind)
        for t in [*np.arange(0.5, window_s + 1e-9, 0.5), math.inf]:
            settled = sched <= t - thr_s
            d = ts.look(min(1.0, t / span), int(settled.sum()), int(over[settled].sum()))
            if d is not None:
                breaches += d == "breach"
                break
    return breaches / steps


@pytest.mark.parametrize("kind", ["pocock", "obrien_fleming"])
def test_false_breach_rate_at_the_threshold_is_within_alpha(kind):
    """True p99 exactly at the threshold (1 % of requests over it): repeated looks do not inflate the
    false-breach rate past alpha (2,000 steps: the rate's standard error is ~0.005)."""
    rate = simulate(2000, rate=15.0, window_s=17.0, thr_s=0.3, tail=0.01, kind=kind, seed=11)
    assert rate <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / 2000), rate
    assert simulate(300, rate=15.0, window_s=17.0, thr_s=0.3, tail=0.04, kind=kind, seed=12) > 0.8  # and it has power


# ------------------------------------------------------------------ a step's looks over records


def capacity_settings(tmp_path, extra: str = "") -> CapacitySettings:
    p = tmp_path / "s.yaml"
    p.write_text("name: t\nworkload: {input_len: 8, output_len: 4}\ntiers: {standard: {slo: {ttft_ms: 300}}}\n"
                 f"search: {{start: 4, step_duration_s: 20, warmup_s: 2{extra}}}\n")
    return CapacitySettings.from_scenario(load_scenario(p))


def recs(n: int, w0: float, gap: float, ttft: float, over_every: int = 0) -> list[RequestRecord]:
    """n requests ``gap`` apart from ``w0``, first tokens after about ``ttft`` s (independent jitter);
    every ``over_every``-th one after 1 s."""
    out = []
    jitter = np.random.default_rng(5).uniform(0.5, 1.5, n)
    for i in range(n):
        s = w0 + i * gap
        f = s + (1.0 if over_every and i % over_every == 0 else ttft * jitter[i])
        out.append(RequestRecord(f"r{i}", 0, "standard", s, sent_s=s, first_token_s=f, token_s=[f], done_s=f + 0.01,
                                 output_tokens=1, status="ok"))
    return out


def test_looks_decide_a_breach_a_pass_or_nothing(tmp_path):
    settings = capacity_settings(tmp_path)
    w0, w1 = 2.0, 20.0
    bad = recs(200, w0, 0.05, 0.05, over_every=10)  # 10 % over 300 ms: a breach within a few seconds
    looks = StepLooks(settings, w0, w1, Counter(standard=360), "bisect")
    d = None
    for t in np.arange(w0 + 0.5, w0 + 10, 0.5):
        d = looks.look([r for r in bad if r.scheduled_s < t], t)
        if d:
            break
    assert d and d.kind == "breach" and d.by in ("confidence", "certain")
    assert d.samples["standard"]["ttft_ms"] > 0
    good = recs(600, w0, 0.03, 0.05)  # 33 req/s, all fast: the pass side decides once ~300 have settled
    looks = StepLooks(settings, w0, w1, Counter(standard=600), "bisect")
    d = None
    for t in np.arange(w0 + 0.5, w1, 0.5):
        d = looks.look([r for r in good if r.scheduled_s < t], t)
        if d:
            break
    assert d and (d.kind, d.by) == ("pass", "confidence") and d.samples["standard"]["ttft_ms"] >= 300
    edge = recs(100, w0, 0.17, 0.05, over_every=100)  # 1 over in 100: too few to tell either way
    looks = StepLooks(settings, w0, w1, Counter(standard=100), "bisect")
    assert all(looks.look([r for r in edge if r.scheduled_s < t], t) is None for t in np.arange(w0 + 0.5, w1, 0.5))
    assert looks.look(edge, 25.0, final=True) is None  # undecided: the cap and the point estimate judge


def test_a_step_stopped_at_its_breach_gives_the_breach_as_its_reason(tmp_path):
    """The looks before the decision are undecided; only the final look of a step that ran to its cap may
    call it undecided (every step used to say so, the first look's verdict kept)."""
    settings = capacity_settings(tmp_path)
    st = StepWindow(3, 8.0, "bisect", 0.0, 2.0, 20.0)
    bad = recs(200, 2.0, 0.05, 0.05, over_every=10)
    looks = StepLooks(settings, st.w0, st.w1, Counter(standard=360), "bisect")
    record_decision(st, looks.look([], 2.5), looks)
    assert st.stop_reason is None and st.decision is None
    d = None
    for t in np.arange(3.0, 12.0, 0.5):
        d = looks.look([r for r in bad if r.scheduled_s < t], t)
        record_decision(st, d, looks)
        if d:
            break
    assert d is not None and st.decision == "breach" and st.stop_reason == d.reason
    assert "undecided" not in st.stop_reason
    edge = recs(100, 2.0, 0.17, 0.05, over_every=100)
    st2 = StepWindow(4, 6.0, "bisect", 0.0, 2.0, 20.0)
    looks2 = StepLooks(settings, st2.w0, st2.w1, Counter(standard=100), "bisect")
    record_decision(st2, looks2.look(edge[:10], 4.0), looks2)
    assert st2.stop_reason is None
    record_decision(st2, looks2.look(edge, 25.0, final=True), looks2, final=True)
    assert st2.decision is None and st2.stop_reason.startswith("undecided at the cap")


def test_step_detail_says_what_decided_it(tmp_path):
    settings = capacity_settings(tmp_path, ", early_pass: false")
    st = StepWindow(3, 8.0, "bisect", 0.0, 2.5, 20.0)
    st.steady, st.loop_lag_ms = True, [0.2] * 50
    records = recs(100, 2.5, 0.17, 0.05, over_every=100)
    looks = StepLooks(settings, st.w0, st.w1, Counter(standard=100), "bisect")
    assert looks.look(records, 25.0, final=True) is None
    st.looks, st.samples = looks.looks, looks.copy_samples()
    d = step_detail(settings, st, records, [], 25.0, 21.0)
    assert d["decided_by"] == "cap" and d["decision"] is None and d["samples"] == {"standard": {"ttft_ms": 100}}
    assert d["warmup_s"] == 2.5 and d["steady"] is True and d["disturbed"] is False and d["disturbance"] is None
    assert d["offered_rps"] == pytest.approx(100 / 17.5) and d["scheduled_rps"] == pytest.approx(100 / 17.5)
    assert d["loop_lag_ms"]["p99"] == pytest.approx(0.2)
    bad, why, _ = disturbance_of({"client_lateness": {"p99_ms": 80.0}}, [1.0] * 10, 10.0)
    assert bad and "lateness 80.0 ms" in why
    bad, why, _ = disturbance_of({"client_lateness": {"p99_ms": 1.0}}, [1.0] * 90 + [60.0] * 10, 10.0)
    assert bad and why.startswith("event-loop p99 lag")


def test_step_detail_counts_the_runs_of_exceedances_in_scheduled_order(tmp_path):
    """Exceedances at most ``decluster_run`` (2) requests apart are one run, in the order the requests were
    scheduled, whatever order the records come in: three runs here (requests 10-14, 17 and 40-41)."""
    settings = capacity_settings(tmp_path, ", early_pass: false")
    st = StepWindow(3, 8.0, "bisect", 0.0, 2.5, 20.0)
    records = recs(100, 2.5, 0.17, 0.05)
    for i in (10, 11, 13, 14, 17, 40, 41):
        r = records[i]
        r.first_token_s = r.scheduled_s + 1.0
        r.token_s, r.done_s = [r.first_token_s], r.first_token_s + 0.01
    records = [records[i] for i in np.random.default_rng(3).permutation(len(records))]
    judged = step_detail(settings, st, records, [], 25.0, 21.0)["tiers"]["standard"]["judged"]["ttft_ms"]
    assert (judged["over"], judged["runs"], judged["n"]) == (7, 3, 100)


def test_search_section_options_are_validated(tmp_path):
    settings = capacity_settings(tmp_path, ", max_warmup_s: 8, alpha: 0.01, alpha_spending: obrien_fleming, "
                                           "look_interval_s: 1")
    assert (settings.step.max_warmup_s, settings.step.alpha, settings.step.alpha_spending,
            settings.step.look_interval_s) == (8.0, 0.01, "obrien_fleming", 1.0)
    assert capacity_settings(tmp_path).step.max_warmup_s == 4.0  # default: twice warmup_s, at most half the step
    for bad, key in ((", max_warmup_s: 1", "search.max_warmup_s"), (", max_warmup_s: 25", "search.max_warmup_s"),
                     (", alpha: 0.7", "search.alpha"), (", alpha_spending: magic", "search.alpha_spending")):
        with pytest.raises(ScenarioError, match=key):
            capacity_settings(tmp_path, bad)


def test_a_step_is_long_enough_for_its_quantile(tmp_path):
    """A p99 over fewer than 100 requests is a lower quantile: the step is lengthened (open loop) until each
    judged tier has that many planned requests after the longest warm-up, at most max_step_duration_s."""
    from loadgen.capacity.early_stop import min_samples, step_length_s

    settings = capacity_settings(tmp_path)  # 20 s steps, 2 s warm-up (4 s at most), p99: 100 requests, at most 80 s
    assert min_samples(settings, "standard") == 100 and settings.step.max_step_duration_s == 80.0
    busy = [(2.0 + i * 0.05, "standard") for i in range(1000)]  # 20 req/s: 360 in the window already
    assert step_length_s(settings, busy) == 20.0
    slow = [(i * 0.25, "standard") for i in range(400)]  # 4 req/s: the 100th after 4 s comes at 28.75 s
    assert step_length_s(settings, slow) == pytest.approx(28.875)  # halfway to the next
    assert step_length_s(settings, slow[:40]) == 80.0  # never enough: the longest step
    assert step_length_s(settings, busy + [(a, "basic") for a, _ in slow[:40]]) == 20.0  # a tier with no SLO needs none
    p90 = capacity_settings(tmp_path, ", quantile: 0.9, max_step_duration_s: 25")
    assert min_samples(p90, "standard") == 10 and step_length_s(p90, slow) == 20.0
    assert step_length_s(capacity_settings(tmp_path, ", max_step_duration_s: 25"), slow) == 25.0
    assert step_length_s(capacity_settings(tmp_path, ", min_samples: 0"), slow) == 20.0
    with pytest.raises(ScenarioError, match="search.max_step_duration_s"):
        capacity_settings(tmp_path, ", max_step_duration_s: 10")


def test_runs_of_exceedances_and_the_effective_sample_size():
    from loadgen.results.sequential import clusters, effective_n
    flags = np.array([0, 1, 1, 0, 1, 0, 0, 0, 1, 0], dtype=bool)
    assert clusters(flags, 0) == 4 and clusters(flags, 2) == 2 and clusters(flags, 1) == 3
    rng = np.random.default_rng(0)
    assert effective_n(rng.lognormal(size=400)) > 300  # independent: nearly all of them
    assert effective_n(np.cumsum(rng.normal(size=400)) + 100) < 40  # a queue's slow drift: very few
