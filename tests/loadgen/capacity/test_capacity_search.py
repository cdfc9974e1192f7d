"""The capacity search against deterministic synthetic latency models (no server, no clock).

An M/M/c queue stands in for an engine with c batch slots: a request's TTFT is its queueing delay plus
a fixed prefill time. Its p99 TTFT as a function of the arrival rate is known in closed form (Erlang C),
so the rate at which p99 crosses the SLO, the true capacity, is known exactly; the search must find it
within its tolerance, from exact quantiles and from noisy finite samples judged like real steps.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from loadgen.capacity.search import CapacitySearch
from loadgen.capacity.search_steps import StepResult
from loadgen.results.latency import quantile
from loadgen.results.slo import SLO, bootstrap_ci, breach_certain, judge
from loadgen.scenario.options import SearchConfig


class MMc:
    def __init__(self, c: int = 8, mu: float = 2.0, prefill_ms: float = 40.0):
        self.c, self.mu, self.prefill_ms = c, mu, prefill_ms

    def erlang_c(self, lam: float) -> float:
        a, c = lam / self.mu, self.c
        rho = a / c
        if rho >= 1:
            return 1.0
        s = sum(a**k / math.factorial(k) for k in range(c))
        top = a**c / math.factorial(c) / (1 - rho)
        return top / (s + top)

    def ttft_quantile_ms(self, lam: float, q: float) -> float:
        """Exact q-quantile of queue wait + prefill: P(W > t) = C exp(-(c mu - lam) t)."""
        if lam >= self.c * self.mu:
            return math.inf
        pc = self.erlang_c(lam)
        if pc <= 1 - q:
            return self.prefill_ms
        t = math.log(pc / (1 - q)) / (self.c * self.mu - lam)
        return self.prefill_ms + 1000.0 * t

    def sample_ms(self, lam: float, n: int, rng: np.random.Generator) -> np.ndarray:
        """n TTFTs of a step at rate lam: the stationary wait distribution (an overloaded queue grows
        linearly over a 10 s step)."""
        if lam >= self.c * self.mu:  # the backlog grows (at least a little, even at exactly c mu)
            t = np.sort(rng.uniform(0, 10, n))
            excess = max(lam - self.c * self.mu, 0.1 * self.c * self.mu)
            return self.prefill_ms + 1000.0 * excess * t / (self.c * self.mu)
        wait = rng.random(n) < self.erlang_c(lam)
        w = np.where(wait, rng.exponential(1 / (self.c * self.mu - lam), n), 0.0)
        return self.prefill_ms + 1000.0 * w

    def capacity(self, slo: SLO) -> float:
        lo, hi = 1e-6, self.c * self.mu * (1 - 1e-12)
        for _ in range(200):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if self.ttft_quantile_ms(mid, slo.quantile) <= slo.threshold_ms else (lo, mid)
        return lo


P99_300 = SLO("ttft_ms", 300.0, 0.99)


def exact_measure(model: MMc, slo: SLO, margins: bool = True):
    def measure(load, phase):
        q = model.ttft_quantile_ms(load, slo.quantile)
        return StepResult(q <= slo.threshold_ms, margin=q / slo.threshold_ms if margins else None)

    return measure


def noisy_measure(model: MMc, slo: SLO, seed: int, step_s: float = 30.0):
    rng = np.random.default_rng(seed)

    def measure(load, phase):
        n = max(5, rng.poisson(load * step_s))
        j = judge(model.sample_ms(load, n, rng), slo, n_boot=200, seed=seed)
        m = math.inf if j.value_ms is None else j.value_ms / slo.threshold_ms
        return StepResult(j.passed, detail={"q": j.value_ms}, margin=m)

    return measure


def test_the_model_is_what_it_says():
    m = MMc()
    assert m.ttft_quantile_ms(0.1, 0.99) == m.prefill_ms  # almost never waits
    assert m.ttft_quantile_ms(15.9, 0.99) > 2000
    cap = m.capacity(P99_300)
    assert 5 < cap < 16 and m.ttft_quantile_ms(cap, 0.99) == pytest.approx(300, abs=1e-3)
    rng = np.random.default_rng(0)
    big = m.sample_ms(cap, 200_000, rng)
    assert np.percentile(big, 99) == pytest.approx(300, rel=0.03)  # the sampler matches the closed form


@pytest.mark.parametrize("c,mu,start", [(8, 2.0, 1.0), (8, 2.0, 30.0), (32, 5.0, 0.5), (2, 10.0, 3.0)])
def test_finds_the_known_capacity_within_tolerance(c, mu, start):
    model = MMc(c, mu)
    truth = model.capacity(P99_300)
    search = CapacitySearch(SearchConfig(start=start, growth=2.0, tolerance=0.05, max_steps=20, min_load=0.01))
    out = search.run(exact_measure(model, P99_300))
    assert out.verdict == "rated" and out.converged
    assert out.rated_load <= truth <= out.first_fail_load  # the bracket holds the truth ...
    assert (out.first_fail_load - out.rated_load) / out.rated_load <= 0.05  # ... and is within tolerance
    assert truth * 0.95 <= out.rated_load <= truth
    phases = [s.phase for s in out.steps]
    assert phases[0] == "ramp" and "ramp" not in phases[phases.index("bisect"):]
    assert phases[-2:] == ["confirm", "confirm"] and out.confirmed  # an exact model agrees with itself
    draws = [s.draw for s in out.steps]
    assert draws == list(range(len(out.steps)))  # search.arrivals fresh (the default): every step its own draw
    common = CapacitySearch(SearchConfig(start=start, growth=2.0, tolerance=0.05, max_steps=20, min_load=0.01,
                                         arrivals="common")).run(exact_measure(model, P99_300))
    assert [s.draw for s in common.steps[-2:]] == [1, 2] and {s.draw for s in common.steps[:-2]} == {0}
    assert common.rated_load == out.rated_load  # an exact model: the draws change nothing


def test_geometric_ramp_then_bisection_step_count():
    model = MMc(8, 2.0)
    plain = CapacitySearch(SearchConfig(start=1, growth=2, tolerance=0.05, interpolate=False)).run(
        exact_measure(model, P99_300))
    loads = [s.load for s in plain.steps]
    assert loads[:4] == [1, 2, 4, 8] and not plain.steps[4].passed  # 16 breaks the 16 req/s queue
    assert loads[5] == pytest.approx(8 * 2**0.5)  # geometric midpoint
    # ramp to the first failure, then log2(log(2)/log(1.05)) bisections, then the two ends confirmed
    assert [s.phase for s in plain.steps] == ["ramp"] * 5 + ["bisect"] * 4 + ["confirm"] * 2
    # with the steps' SLO margins, false position needs fewer steps for the same bracket
    interp = CapacitySearch(SearchConfig(start=1, growth=2, tolerance=0.05)).run(exact_measure(model, P99_300))
    assert interp.converged and interp.rated_load <= model.capacity(P99_300) <= interp.first_fail_load
    assert len(interp.steps) < len(plain.steps) and interp.confirmed


@pytest.mark.parametrize("c,mu", [(8, 2.0), (32, 5.0), (2, 10.0), (64, 1.0)])
def test_interpolation_never_needs_many_more_steps_than_bisection(c, mu):
    model = MMc(c, mu)
    for start in (0.5, 3.0, 10.0):
        cfg = dict(start=start, growth=2, tolerance=0.02, max_steps=40, min_load=0.01)
        plain = CapacitySearch(SearchConfig(**cfg, interpolate=False)).run(exact_measure(model, P99_300))
        interp = CapacitySearch(SearchConfig(**cfg)).run(exact_measure(model, P99_300))
        assert interp.converged and interp.rated_load <= model.capacity(P99_300) <= interp.first_fail_load
        n_bis = sum(s.phase == "bisect" for s in plain.steps)
        assert sum(s.phase == "bisect" for s in interp.steps) <= 2 * n_bis


@pytest.mark.parametrize("seed", range(12))
def test_copes_with_noise(seed):
    """Finite-sample p99s (~250 requests a step) judged like real steps: the p99 of a step is itself
    noisy (+-30% here), and near capacity p99 grows ~2.5x faster than the rate, so the rating lands
    within +-15% of the truth, where the true p99 is within 1.5x the threshold."""
    model = MMc(8, 2.0)
    truth = model.capacity(P99_300)
    cfg = SearchConfig(start=1, growth=2, tolerance=0.05, max_steps=14)
    out = CapacitySearch(cfg).run(noisy_measure(model, P99_300, seed))
    assert out.verdict == "rated"
    assert truth * 0.85 <= out.rated_load <= truth * 1.15, (out.rated_load, truth)
    assert model.ttft_quantile_ms(out.rated_load, 0.99) <= 1.5 * P99_300.threshold_ms


def test_noise_spread_is_small_across_seeds():
    model = MMc(8, 2.0)
    truth = model.capacity(P99_300)
    rated = [CapacitySearch(SearchConfig(start=1, growth=2)).run(noisy_measure(model, P99_300, s)).rated_load
             for s in range(20)]
    assert abs(np.median(rated) / truth - 1) < 0.06  # no bias
    assert np.std(rated) / np.mean(rated) < 0.08


def test_always_failing_target_is_never_met():
    calls = []

    def measure(load, phase):
        calls.append(load)
        return StepResult(False)

    out = CapacitySearch(SearchConfig(start=4, growth=2, min_load=0.5)).run(measure)
    assert out.verdict == "never_met" and out.rated_load is None and out.converged
    assert calls == [4, 2, 1, 0.5]  # ramps down to min_load, then stops
    assert "never met" in out.text and "0.5" in out.text


def test_never_failing_target_never_broke():
    out = CapacitySearch(SearchConfig(start=1, growth=2, max_load=20)).run(lambda load, phase: StepResult(True))
    assert out.verdict == "never_broke" and out.rated_load == 20 and out.converged
    assert [s.load for s in out.steps] == [1, 2, 4, 8, 16, 20]  # the last step is max_load itself
    assert "at least" in out.text


def test_unknown_verdicts_count_as_failures_and_budget_is_reported():
    # a step that could judge nothing (passed=None) is a failure; a small budget leaves the bracket wide
    model = MMc(8, 2.0)
    ex = exact_measure(model, P99_300)
    out = CapacitySearch(SearchConfig(start=1, growth=2, max_steps=6)).run(
        lambda load, phase: StepResult(None) if load > 12 else ex(load, phase))
    # the budget counts ramp and bisection steps; the bracket it leaves is still confirmed
    assert out.verdict == "rated" and not out.converged and len(out.steps) == 6 + 2
    assert "step budget" in out.text and [s.phase for s in out.steps[-2:]] == ["confirm", "confirm"]
    out = CapacitySearch(SearchConfig(start=1, growth=2, max_steps=3, max_load=100)).run(
        lambda load, phase: StepResult(True))
    assert out.verdict == "never_broke" and not out.converged and "stopped after 3 steps" in out.text


def test_first_step_fails_then_passes_lower():
    model = MMc(8, 2.0)
    truth = model.capacity(P99_300)
    out = CapacitySearch(SearchConfig(start=100, growth=2, min_load=0.1)).run(exact_measure(model, P99_300))
    assert [s.load for s in out.steps][:4] == [100, 50, 25, 12.5]
    assert out.verdict == "rated" and out.rated_load <= truth <= out.first_fail_load


def test_concurrency_axis_uses_whole_users():
    # closed loop: SLO met up to 13 users
    out = CapacitySearch(SearchConfig(axis="concurrency", start=1, growth=2)).run(
        lambda load, phase: StepResult(load <= 13))
    assert out.verdict == "rated" and out.rated_load == 13 and out.first_fail_load == 14
    assert all(float(s.load).is_integer() for s in out.steps)
    out = CapacitySearch(SearchConfig(axis="concurrency", start=3, growth=1.5)).run(
        lambda load, phase: StepResult(False))
    assert out.verdict == "never_met" and [s.load for s in out.steps] == [3, 2, 1]


def test_bad_search_config():
    for kw in ({"axis": "tokens"}, {"growth": 1.0}, {"start": 0}, {"tolerance": 0}, {"max_steps": 0},
               {"start": 5, "max_load": 2}, {"max_duration_s": 0}):
        with pytest.raises(ValueError):
            SearchConfig(**kw)


# ------------------------------------------------------------------ the SLO judge


def test_quantile_matches_numpy_and_handles_failures():
    rng = np.random.default_rng(1)
    v = rng.exponential(100, 501)
    for q in (0.5, 0.9, 0.99):
        assert quantile(v, q) == pytest.approx(np.percentile(v, 100 * q))
    assert quantile([1, 2, math.inf], 0.5) == 2  # the median is a real request
    assert quantile([1, 2, math.inf], 0.99) == math.inf  # p99 falls on a failed one
    assert math.isnan(quantile([], 0.5))


def test_judge_and_bootstrap_interval():
    rng = np.random.default_rng(2)
    v = rng.exponential(100, 2000)  # true p99 = 100 ln 100 = 460.5
    j = judge(v, SLO("ttft_ms", 600, 0.99))
    assert j.passed and j.confident and j.ci_low_ms < 460.5 < j.ci_high_ms < 600
    assert bootstrap_ci(v, 0.99) == bootstrap_ci(v, 0.99)  # seeded
    j = judge(v[:50], SLO("ttft_ms", 300, 0.99))  # p99 of 50 samples: the interval is wide
    assert not j.confident and j.ci_high_ms - j.ci_low_ms > 100
    j = judge(np.r_[np.full(90, 10.0), np.full(10, math.inf)], SLO("ttft_ms", 300, 0.99))
    assert j.passed is False and j.value_ms is None and j.failed == 10 and j.over == 10
    assert judge([], P99_300).passed is None


def test_breach_certain_is_exact():
    slo = SLO("ttft_ms", 300, 0.99)
    # 100 planned: p99 = v[98] + 0.01 (v[99] - v[98]); one slow request can not sink it, two do
    assert not breach_certain([1000.0], 100, slo)
    assert breach_certain([1000.0, 1000.0], 100, slo)
    assert not breach_certain([10.0] * 50, 100, slo)


def test_early_stopped_failures_do_not_steer_the_interpolation():
    """A breach caught early reports a margin just over 1: trusting it would put every guess next to the
    failing end. Such brackets are bisected, so the search still converges in bisection's step count."""
    model = MMc(8, 2.0)

    def measure(load, phase):
        q = model.ttft_quantile_ms(load, 0.99)
        if q <= 300:
            return StepResult(True, margin=q / 300)
        return StepResult(False, stopped_early=True, margin=1.01)

    out = CapacitySearch(SearchConfig(start=1, growth=2)).run(measure)
    bis = [s.load for s in out.steps if s.phase == "bisect"]
    assert bis[0] == pytest.approx(8 * 2**0.5) and len(bis) <= 4 and out.converged
