"""The planner's simulation of continuous batching against queueing theory: with a constant step time,
one-token prompts and c batch slots it is an M/D/c queue (a request holds a slot for exactly its answer's
steps), so its waits must match the Pollaczek-Khinchine mean for M/D/1 and, for M/D/c, an independent
computation of the same queue: the FIFO c-server recursion (each arrival takes the slot that frees first)
over the very same arrival times."""

from __future__ import annotations

import heapq

import numpy as np
import pytest

from loadgen.planning.requests import Requests
from loadgen.planning.simulate import EngineShape, simulate
from loadgen.planning.step_model import ConstantStep

STEP_S = 0.01
STEPS = 100  # a request's answer: it holds its slot STEPS x STEP_S = 1 s
SERVICE_S = STEPS * STEP_S


def poisson_requests(n: int, seed: int, tiers: list[str] | None = None) -> Requests:
    rng = np.random.default_rng(seed)
    tier = np.asarray(tiers if tiers is not None else ["none"] * n)
    return Requests(arrive=np.cumsum(rng.exponential(1.0, n)), n_in=np.ones(n, dtype=np.int64),
                    n_out=np.full(n, STEPS, dtype=np.int64), tier=tier, prefix=np.full(n, -1),
                    prefix_len=np.zeros(n, dtype=np.int64))


def queue(c: int) -> EngineShape:
    # admission every step, no admission control, a pool that never binds: nothing but the c slots
    return EngineShape(max_num_seqs=c, rebatch_interval=1, admission="none", kv_tokens=1 << 40)


def fifo_waits(arrive: np.ndarray, service_s: float, c: int) -> np.ndarray:
    """The independent method: the Kiefer-Wolfowitz recursion of a FIFO c-server queue."""
    free = [0.0] * c
    out = np.empty(len(arrive))
    for i, a in enumerate(arrive.tolist()):
        start = max(a, free[0])
        heapq.heapreplace(free, start + service_s)
        out[i] = start - a
    return out


def test_md1_mean_wait_is_pollaczek_khinchine():
    rho = 0.6
    req = poisson_requests(40000, seed=1)
    res = simulate(req, rho / SERVICE_S, queue(1), ConstantStep(STEP_S))
    mu = 1 / SERVICE_S
    expected = rho / (2 * mu * (1 - rho))  # 0.75 s
    waits = res.wait_s[4000:]
    assert abs(waits.mean() - expected) / expected < 0.05
    # each request holds its slot exactly its answer's steps, and its first token comes one step after it starts
    assert np.allclose(res.done_s - res.start_s, SERVICE_S)
    assert np.allclose(res.first_s - res.start_s, STEP_S)


def test_mdc_waits_match_the_fifo_recursion_on_the_same_arrivals():
    c, rho = 4, 0.8
    req = poisson_requests(30000, seed=2)
    rate = rho * c / SERVICE_S
    res = simulate(req, rate, queue(c), ConstantStep(STEP_S))
    exact = fifo_waits(req.arrive / rate, SERVICE_S, c)
    # the simulation admits at step boundaries: a request finding a free slot while others run waits for the
    # step under way, at most one step longer than in continuous time
    assert abs(res.wait_s.mean() - exact.mean()) <= STEP_S
    assert exact.mean() > 10 * STEP_S  # a real queue, not a trivially empty one
    q_sim, q_exact = np.quantile(res.wait_s, 0.99), np.quantile(exact, 0.99)
    assert abs(q_sim - q_exact) <= 2 * STEP_S


def test_strict_tiers_serve_premium_first():
    n = 20000
    rng = np.random.default_rng(3)
    tiers = rng.choice(["premium", "standard"], size=n).tolist()
    req = poisson_requests(n, seed=3, tiers=tiers)
    res = simulate(req, 0.9 * 2 / SERVICE_S, queue(2), ConstantStep(STEP_S))
    prem, std = res.wait_s[req.tier == "premium"], res.wait_s[req.tier == "standard"]
    assert prem.mean() < 0.5 * std.mean()
    assert not res.rejected.any()


def test_queued_requests_past_their_deadline_are_shed_and_the_tail_factor_learns():
    """As engine/core/admission.py does: a burst admitted before any rate was measured (the estimate says no
    wait) queues behind one 1 s request; each one still waiting at the engine's share of its promise less
    its own steps (0.8 x 300 ms - 2 steps) is shed, refused, instead of a first token seconds late; every
    shed one raises the tier's tail factor by exp(0.05 x 0.99), one within the target lowers it."""
    from loadgen.planning.simulate import _Admission

    n = 5
    req = Requests(arrive=np.arange(n) * 1e-3, n_in=np.ones(n, dtype=np.int64), n_out=np.full(n, STEPS),
                   tier=np.asarray(["premium"] * n), prefix=np.full(n, -1), prefix_len=np.zeros(n, dtype=np.int64))
    eng = EngineShape(max_num_seqs=1, rebatch_interval=1, admission="slo", kv_tokens=1 << 40,
                      tier_ttft_slo_ms={"premium": 300.0})
    res = simulate(req, 1.0, eng, ConstantStep(STEP_S))
    assert res.rejected.tolist() == [False, True, True, True, True]
    assert res.first_s[0] - res.arrive[0] == pytest.approx(STEP_S)
    without = simulate(req, 1.0, EngineShape(max_num_seqs=1, rebatch_interval=1, admission="none",
                                             kv_tokens=1 << 40), ConstantStep(STEP_S))
    assert not without.rejected.any() and (without.first_s - without.arrive)[-1] > 3.9  # what shedding spares

    adm = _Admission(eng)
    adm.step = STEP_S
    assert adm.shed_deadline_s("premium", 1) == pytest.approx(0.24 - 2 * STEP_S)
    assert adm.shed_deadline_s("standard", 1) is None  # no promise, never shed
    adm.outcome("premium", None)
    assert adm.tail["premium"] == pytest.approx(np.exp(0.05 * 0.99))
    for _ in range(2000):
        adm.outcome("premium", 0.01)
    assert adm.tail["premium"] == 0.5  # within the target ever after: down to its bound
    adm.idle(0.05)
    assert adm.tail["premium"] == 0.5  # a moment's idleness is the same busy period
    adm.idle(0.1)
    assert adm.tail == {}  # a new busy period: every tier back at 1, as the engine's IDLE_FORGET_S does
