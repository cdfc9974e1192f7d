"""The rated capacity's safeguards in the pure search (no server, no clock): fresh arrival patterns for
the steps that confirm the bracket, a confirmation that reopens it, disturbed steps measured again and a
verdict that still rests on one (``invalid``)."""

from __future__ import annotations

import numpy as np
import pytest

from loadgen.capacity.search import CapacitySearch
from loadgen.capacity.search_steps import StepResult
from loadgen.scenario.options import SearchConfig
from loadgen.scenario.parse import load_scenario
from loadgen.scenario.steps import arrival_seed, step_specs


def times(scn, load, index, draw=0, dur=10.0):
    return [s.arrival_s for s in step_specs(scn, "rate", load, index, 0.0, dur, draw=draw)]


def test_fresh_draws_differ_and_draw_zero_is_common(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text("name: d\nseed: 4\nworkload: {input_len: 8, output_len: 4}\ntiers: {standard: {slo: {ttft_ms: 300}}}\n"
                 "load: {duration_s: 10}\n")
    scn = load_scenario(p)
    a, b = times(scn, 10, 0), times(scn, 10, 5)
    assert a == b  # common random numbers: one pattern, whatever the step
    f1, f2 = times(scn, 10, 5, draw=1), times(scn, 10, 5, draw=2)
    assert f1 != a and f2 != a and f1 != f2
    assert times(scn, 10, 7, draw=1) == f1  # a draw is a pattern, reproducible
    assert arrival_seed(4, 0) == 4 and len({arrival_seed(4, k) for k in range(5)}) == 5
    # at twice the rate the same draw is the same pattern scaled: half the gaps
    assert np.allclose(times(scn, 20, 0, draw=1, dur=5.0), np.asarray(f1)[np.asarray(f1) < 10.0] / 2)
    with pytest.raises(ValueError):
        step_specs(scn, "rate", 10, 0, 0.0, 10.0, draw=-1)


def test_exact_window_counts_offer_the_step_s_load_whichever_mark_the_warm_up_ends_at(tmp_path):
    """``search.window_counts: exact``: a capacity step's arrivals are counted exactly at every time its warm-up
    may end and at its planned end, so every window the warm-up can leave offers exactly the step's load; the
    default (drawn) leaves the count to the draw, and a closed-loop search has no schedule to count."""
    from loadgen.capacity.settings import CapacitySettings

    base = ("name: w\nseed: 4\nworkload: {input_len: 8, output_len: 4}\ntiers: {standard: {slo: {ttft_ms: 300}}}\n"
            "search: {step_duration_s: 20, warmup_s: 3%s}\n")
    p = tmp_path / "s.yaml"
    p.write_text(base % ", window_counts: exact")
    settings = CapacitySettings.from_scenario(load_scenario(p))
    assert settings.count_marks == (3.0, 4.0, 5.0, 6.0, 20.0)
    for draw in (1, 2, 3):
        t = np.array([s.arrival_s for s in step_specs(settings.scenario, "rate", 53.8, 5, 0.0, 20.0, draw=draw,
                                                      exact_at=settings.count_marks)])
        for w0 in settings.count_marks[:-1]:
            assert int(((t >= w0) & (t < 20.0)).sum()) == round(53.8 * 20.0) - round(53.8 * w0)
    p.write_text(base % "")
    assert CapacitySettings.from_scenario(load_scenario(p)).count_marks == ()
    p.write_text(base % ", window_counts: exact, axis: concurrency")
    assert CapacitySettings.from_scenario(load_scenario(p)).count_marks == ()


def test_a_trace_draw_is_the_next_slice_of_its_rows(tmp_path):
    rng = np.random.default_rng(0)
    t = np.cumsum(rng.exponential(1.0, 400))
    rows = "\n".join(f"2023-11-16 18:{int(x // 60) % 60:02d}:{x % 60:09.6f},{10 + i % 7},{3 + i % 5}"
                     for i, x in enumerate(t))
    trace = tmp_path / "t.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + rows + "\n")
    p = tmp_path / "s.yaml"
    p.write_text(f"name: tr\nworkload: {{type: trace, path: {trace}, format: azure}}\n"
                 "tiers: {standard: {slo: {ttft_ms: 300}}}\n")
    scn = load_scenario(p)
    d0, d1, d2 = (step_specs(scn, "rate", 10, 1, 0.0, 10.0, draw=d) for d in (0, 1, 2))
    assert d0 and d1 and d2 and d1[0].arrival_s == 0.0
    gaps = [np.diff([s.arrival_s for s in d]) for d in (d0, d1, d2)]
    assert not np.allclose(gaps[0][:20], gaps[1][:20]) and not np.allclose(gaps[1][:20], gaps[2][:20])
    assert [s.prompt_tokens for s in d1][:5] != [s.prompt_tokens for s in d0][:5]  # other rows


# ------------------------------------------------------------------ confirmation


def test_confirmation_with_a_fresh_draw_reopens_a_bracket_the_common_pattern_misled():
    """Draw 0 happens to be sparse: on it every load up to 10 passes; on any other pattern only up to 9.
    The bisection on draw 0 converges at 10; the pass end, confirmed on fresh draws, fails twice, the
    bracket reopens, and the steps after it (each on its own fresh draw) find the true 9 (one more
    reopening on the way: the pass end below was a draw-0 pass too)."""
    def measure(load, phase, draw):
        return StepResult(load <= (10.0 if draw == 0 else 9.0))

    s = CapacitySearch(SearchConfig(start=2, growth=2, tolerance=0.03, max_steps=20, arrivals="common"))
    out = s.run(measure, draws=True)
    assert out.verdict == "rated" and out.confirmed and out.converged and 1 <= out.reopens <= 2
    assert 9.0 * 0.97 <= out.rated_load <= 9.0 < out.first_fail_load
    first_confirm = next(st for st in out.steps if st.phase == "confirm")
    assert first_confirm.load > 9.0 and first_confirm.draw == 1 and not first_confirm.passed
    tie_break = out.steps[first_confirm.index + 1]
    assert tie_break.phase == "confirm" and tie_break.load == first_confirm.load and tie_break.draw == 2
    after = out.steps[tie_break.index + 1:]
    assert after and all(st.draw > 2 for st in after) and len({st.draw for st in after}) == len(after)
    # the deciding steps are the measurements that agree with the ends' verdicts, on different draws
    dec = [out.steps[i] for i in out.deciding]
    assert {st.load for st in dec} == {out.rated_load, out.first_fail_load}
    assert all(st.passed == (st.load == out.rated_load) for st in dec)
    assert "reopening" in out.text


def test_a_reopened_bracket_gets_the_bisections_it_needs_when_the_ramp_spent_the_budget():
    """The ramp's 64 passes on the common pattern, fresh draws fail there (the truth: 58); the budget is
    spent by the ramp and the first bisections. The reopened bracket [32, 64] still converges to 5 %."""
    def measure(load, phase, draw):
        return StepResult(load <= (64.0 if draw == 0 else 58.0))

    cfg = SearchConfig(start=4, growth=2, tolerance=0.05, max_steps=9, arrivals="common")
    out = CapacitySearch(cfg).run(measure, draws=True)
    assert out.verdict == "rated" and out.reopens >= 1 and out.converged and out.confirmed
    assert 58.0 / 1.05 <= out.rated_load <= 58.0 < out.first_fail_load <= out.rated_load * 1.05
    assert "step budget" not in out.text
    searched = [st for st in out.steps if st.phase != "confirm"]
    assert len(searched) > 9  # past max_steps, by the bisections the reopened bracket needed
    assert len(searched) <= 9 + out.reopens * 4  # log2(ln 2 / ln 1.05) -> 4 per reopening at most


def test_a_disagreeing_confirmation_is_broken_by_a_third_draw():
    """A pass end that fails once on a fresh draw and passes on the next keeps its rating (2 of 3)."""
    seen = {}

    def measure(load, phase, draw):
        seen[draw] = load
        return StepResult(not (phase == "confirm" and draw == 1) and load <= 8.0)

    out = CapacitySearch(SearchConfig(start=2, growth=2, tolerance=0.05, arrivals="common")).run(measure, draws=True)
    assert out.verdict == "rated" and out.confirmed and out.reopens == 0
    at = [st for st in out.steps if st.load == out.rated_load]
    assert [st.passed for st in at] == [True, False, True] and [st.draw for st in at] == [0, 1, 2]
    assert out.deciding == sorted([at[0].index, at[2].index] + [st.index for st in out.steps
                                                                if st.load == out.first_fail_load])


def test_confirmations_are_bounded():
    """A target whose every fresh draw contradicts the common pattern: the search stops confirming after
    max_reopens reopenings and says the bracket is unconfirmed."""

    def measure(load, phase, draw):
        return StepResult((load <= 8.0) if draw == 0 else load > 8.0)

    s = CapacitySearch(SearchConfig(start=2, growth=2, tolerance=0.05, max_steps=30, arrivals="common"), max_reopens=1)
    out = s.run(measure, draws=True)
    assert out.verdict == "rated" and len(out.steps) < 60
    # the second contradiction is found but no longer acted on: the bracket stays as it is, unconfirmed
    assert out.confirmed is False and out.reopens == 2 and "unconfirmed" in out.text


def test_ending_the_search_mid_confirmation_keeps_the_bracket_and_says_why():
    """``end()`` (the run's time budget) stops the search where it is: the bracket measured so far is the
    verdict, unconfirmed, and the text says why rather than blaming the reopenings."""
    s = CapacitySearch(SearchConfig(start=2, growth=2, tolerance=0.05, max_steps=20))
    while (nxt := s.next_step()) is not None and nxt[1] != "confirm":
        s.record(nxt[0], StepResult(nxt[0] <= 9.0))
    assert nxt is not None and nxt[1] == "confirm"
    s.end("the time budget ended the search (test)")
    assert s.next_step() is None
    out = s.outcome()
    assert out.verdict == "rated" and out.converged and out.confirmed is False
    assert out.rated_load <= 9.0 < out.first_fail_load
    assert out.ended_by == "the time budget ended the search (test)" and out.text.endswith(out.ended_by)
    assert "unconfirmed" in out.text and "the most allowed" not in out.text


def test_ending_the_search_mid_bisection_says_the_tolerance_was_not_reached():
    s = CapacitySearch(SearchConfig(start=2, growth=2, tolerance=0.01, max_steps=20))
    while (nxt := s.next_step()) is not None and nxt[1] != "bisect":
        s.record(nxt[0], StepResult(nxt[0] <= 9.0))
    s.end("the time budget ended the search (test)")
    out = s.outcome()
    assert out.verdict == "rated" and not out.converged
    assert "the search was ended before the 1% tolerance" in out.text and "step budget" not in out.text


def test_without_confirmation_the_search_is_the_old_one():
    out = CapacitySearch(SearchConfig(start=1, growth=2), confirm=False).run(lambda load, phase: StepResult(load <= 5))
    assert "confirm" not in {st.phase for st in out.steps} and out.confirmed is None


def test_refine_windows_come_after_the_confirmed_bracket_and_move_neither_it_nor_the_verdict():
    """Refine windows sit at the bracket's centre, each on a fresh draw; even when every one of them fails
    (as a noisy window near the knee may) the bracket, the verdict and the deciding steps are the
    search's without them."""
    def measure(load, phase, draw):
        return StepResult(phase != "refine" and load <= 9.0)

    base = CapacitySearch(SearchConfig(start=2, growth=2, tolerance=0.03)).run(measure, draws=True)
    out = CapacitySearch(SearchConfig(start=2, growth=2, tolerance=0.03, refine_steps=7)).run(measure, draws=True)
    assert len(out.steps) == len(base.steps) + 7
    assert [st.phase for st in out.steps] == [st.phase for st in base.steps] + ["refine"] * 7
    centre = (base.rated_load * base.first_fail_load) ** 0.5
    assert [st.load for st in out.steps[-7:]] == pytest.approx([centre] * 7)
    draws = [st.draw for st in out.steps]
    assert len(set(draws)) == len(draws)  # every refine window its own draw
    assert (out.verdict, out.rated_load, out.first_fail_load, out.confirmed, out.deciding) == (
        base.verdict, base.rated_load, base.first_fail_load, base.confirmed, base.deciding)


@pytest.mark.parametrize("estimate, where", [(9.3, 9.3), (100.0, "hi"), (0.5, "lo"), (None, "centre")])
def test_refine_windows_go_to_the_estimate_kept_near_the_bracket(estimate, where):
    """``refine_centre`` (the rating's estimate so far) places them; one far off is kept within x/÷ 1.25 of
    the bracket's ends, and without one they sit at its centre."""
    from loadgen.capacity.refine import REFINE_REACH

    seen = []

    def centre(steps):
        seen.append(len(steps))
        return estimate

    measure = lambda load, phase, draw: StepResult(load <= 9.0)  # noqa: E731
    out = CapacitySearch(SearchConfig(start=2, growth=2, tolerance=0.03, refine_steps=3),
                         refine_centre=centre).run(measure, draws=True)
    lo, hi = out.rated_load, out.first_fail_load
    want = {"hi": hi * REFINE_REACH, "lo": lo / REFINE_REACH, "centre": (lo * hi) ** 0.5}.get(where, where)
    refine = [st for st in out.steps if st.phase == "refine"]
    assert [st.load for st in refine] == pytest.approx([want] * 3)
    assert seen == [st.index for st in refine]  # asked before each refine window, with every step so far


def test_refine_steps_is_validated():
    with pytest.raises(ValueError, match="refine_steps"):
        SearchConfig(refine_steps=-1)


# ------------------------------------------------------------------ disturbed steps


def test_a_disturbed_step_is_measured_again_and_decides_nothing():
    calls = []

    def measure(load, phase, draw):
        calls.append((load, phase, draw))
        first_time = calls.count((load, phase, draw)) == 1
        # the load generator stalls in the very first step: it "fails" (late sends look like slow answers)
        if load == 2 and first_time:
            return StepResult(False, disturbed="event-loop lag 180 ms over the 50 ms bound")
        return StepResult(load <= 6.0)

    out = CapacitySearch(SearchConfig(start=2, growth=2, tolerance=0.05)).run(measure, draws=True)
    s0, s1 = out.steps[0], out.steps[1]
    assert s0.load == s1.load == 2 and s0.disturbed and not s0.counted
    assert s1.remeasured_of == 0 and s1.attempt == 2 and s1.counted and s1.passed and s1.draw == s0.draw
    assert out.verdict == "rated" and 6.0 * 0.95 <= out.rated_load <= 6.0  # not rated low by the stall
    assert 0 not in out.deciding


def test_a_step_still_disturbed_after_its_retries_makes_the_verdict_invalid():
    def measure(load, phase, draw):
        if load == 4:  # every attempt at the pass end stalls
            return StepResult(True, disturbed="client p99 lateness 35 ms over the 10 ms bound")
        return StepResult(load <= 4)

    s = CapacitySearch(SearchConfig(start=1, growth=2, tolerance=0.05, axis="concurrency"), retries=2)
    out = s.run(measure, draws=True)
    at4 = [st for st in out.steps if st.load == 4]
    assert [st.attempt for st in at4[:3]] == [1, 2, 3] and [st.counted for st in at4[:3]] == [False, False, True]
    assert at4[1].remeasured_of == at4[0].index and at4[2].remeasured_of == at4[1].index
    assert out.search_verdict == "rated" and out.rated_load == 4 and out.verdict == "invalid"
    assert at4[2].index in out.deciding and "still disturbed after 2 re-measure(s)" in out.invalid_reason
    assert "lateness 35 ms" in out.invalid_reason and out.text.startswith("INVALID")


def test_a_disturbed_step_that_does_not_decide_leaves_the_verdict_valid():
    def measure(load, phase, draw):
        return StepResult(load <= 5, disturbed="lag" if load == 1 else None)

    out = CapacitySearch(SearchConfig(start=1, growth=2, axis="concurrency"), retries=1).run(measure, draws=True)
    assert [st.counted for st in out.steps[:2]] == [False, True] and out.steps[1].disturbed
    assert out.verdict == "rated" and out.rated_load == 5 and out.invalid_reason is None
