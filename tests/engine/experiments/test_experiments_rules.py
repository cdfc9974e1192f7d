"""Each experiment's rule judges its claim as the seed words it: findings built from made-up measurements on
either side of the stated bound or band hold or not as the rule says (no engine runs, no timing)."""

from __future__ import annotations

import pytest

from engine.experiments.batching import BatchingParams, batching_finding
from engine.experiments.chunked_prefill import ChunkedParams, cost_finding, stall_finding
from engine.experiments.kv_memory import PrefixParams, sharing_finding
from engine.experiments.overload import OverloadParams, loss_finding, premium_finding
from engine.experiments.tiers import MixParams, mix_finding


def chunked(max_gap: float, normal: float = 4.0, missed: int = 0, ttft: float = 1000.0) -> dict:
    return {"max_decode_gap_ms": max_gap, "median_decode_gap_ms": normal, "longest_prefill_step_ms": max_gap,
            "prefill_steps": 16, "decode_steps_missed": missed, "long_ttft_ms": ttft}


@pytest.mark.parametrize(("largest", "holds"), [(117.0, False), (8.0, True), (6.0, True), (8.5, False)])
def test_a_decode_gap_beyond_twice_a_normal_one_is_a_stall(largest, holds):
    """117 ms against a normal 4 ms gap is a stall even though it is far below the whole prefill's gap."""
    f = stall_finding(ChunkedParams(), chunked(largest), chunked(2400.0, missed=16))
    assert f.holds is holds
    assert "2x the normal gap" in f.rule
    assert bool(f.note) is not holds


def test_a_stall_note_says_whether_the_decodes_missed_steps():
    every = stall_finding(ChunkedParams(), chunked(117.0), chunked(2400.0))
    skipped = stall_finding(ChunkedParams(), chunked(117.0, missed=3), chunked(2400.0))
    assert "a token in every one of the 16 steps" in every.note
    assert "missed 3 step(s)" in skipped.note


@pytest.mark.parametrize(("extra", "holds"), [(-0.532, False), (-0.01, False), (0.0, True), (0.10, True),
                                              (0.20, True), (0.21, False), (0.40, False)])
def test_about_ten_percent_longer_is_a_band_around_ten_percent(extra, holds):
    on, off = chunked(100.0, ttft=1000.0 * (1 + extra)), chunked(2400.0, ttft=1000.0)
    f = cost_finding(ChunkedParams(), on, off, chunked(0.0, ttft=1100.0), chunked(0.0, ttft=1000.0))
    assert f.holds is holds
    assert f.value == pytest.approx(extra)
    assert "0.0% to 20.0%" in f.rule
    assert bool(f.note) is not holds


def blocks(per_seq: float) -> dict:
    return {"mean_blocks_per_seq": per_seq, "mean_running": 8.0}


@pytest.mark.parametrize(("saved", "holds"), [(0.616, False), (0.51, False), (0.50, True), (0.40, True),
                                              (0.372, True), (0.30, True), (0.29, False)])
def test_up_to_forty_percent_is_judged_within_ten_points(saved, holds):
    f = sharing_finding(PrefixParams(), blocks(36.7 * (1 - saved)), blocks(36.7))
    assert f.holds is holds
    assert "30.0% to 50.0%" in f.rule
    assert bool(f.note) is not holds


def test_saving_far_more_than_forty_percent_says_so():
    f = sharing_finding(PrefixParams(), blocks(14.1), blocks(36.7))
    assert not f.holds and f.note.startswith("it saves more than claimed")


def batch(tok_s: float) -> dict:
    return {"output_tok_s": tok_s, "mean_running": 20.0, "mean_step_ms": 10.0}


@pytest.mark.parametrize(("ratio", "holds"), [(1.34, False), (2.0, True), (2.76, True), (3.0, True), (3.5, False)])
def test_two_to_three_times_is_a_range_not_a_floor(ratio, holds):
    f = batching_finding(BatchingParams(), batch(1000.0 * ratio), batch(1000.0))
    assert f.holds is holds
    assert bool(f.note) is not holds
    assert ("more than claimed" in f.note) is (ratio > 3)


def overload_figures(lost: int = 0, swaps: int = 10, premium: int = 100, within: int = 100,
                     premium_refused: int = 0) -> dict:
    return {"capacity_rps": 10.0, "offered": 500, "served": 400, "lost": lost,
            "lost_reasons": ["abort"] if lost else [],
            "refused": {"queue_full": 0, "slo_unattainable": 90, "shed": 10}, "swap_outs": swaps,
            "peak_kv_usage": 0.92 if swaps else 0.6, "p99_ttft_ms": {"premium": 150.0},
            "refused_by_tier": {"premium": premium_refused}, "premium_offered": premium,
            "premium_within_promise": within}


@pytest.mark.parametrize(("lost", "swaps", "holds"), [(0, 10, True), (1, 10, False), (0, 0, False)])
def test_no_failures_needs_swapping_to_have_run(lost, swaps, holds):
    f = loss_finding(OverloadParams(), overload_figures(lost=lost, swaps=swaps))
    assert f.holds is holds
    assert bool(f.note) is not holds
    assert ("not exercised" in f.note) is (swaps == 0)


@pytest.mark.parametrize(("within", "refused", "holds"), [(100, 0, True), (99, 1, True), (90, 10, False),
                                                          (95, 0, False)])
def test_a_refused_premium_request_misses_its_promise(within, refused, holds):
    """The served premium requests' p99 (150 ms) is within 300 ms throughout: refusals decide."""
    f = premium_finding(OverloadParams(), overload_figures(within=within, premium_refused=refused))
    assert f.holds is holds
    assert bool(f.note) is not holds


def test_no_premium_traffic_does_not_hold():
    f = premium_finding(OverloadParams(), overload_figures(premium=0, within=0))
    assert not f.holds and "not tested" in f.note


def deployment(p99: float, batch_tok_s: float) -> dict:
    return {"interactive_p99_ttft_ms": p99, "deployment_batch_tok_s": batch_tok_s}


SEPARATED = {"interactive_p99_ttft_ms": 40.0, "deployment_batch_tok_s": 1000.0}


def test_a_tier_aware_mix_that_serves_both_sides_refutes_the_claim():
    runs = {"mixed, 64 slots": deployment(3000.0, 4000.0),
            "mixed, 64 slots, tiers premium/basic": deployment(60.0, 3900.0)}
    f = mix_finding(MixParams(), runs, SEPARATED)
    assert not f.holds
    assert "tiers premium/basic" in f.note and "priority tiers" in f.note
    assert "tiers (interactive/batch)" in f.setting


def test_one_side_unhappy_in_every_tuning_holds():
    runs = {"mixed, 64 slots": deployment(3000.0, 4000.0),
            "mixed, 8 slots, tiers premium/basic": deployment(60.0, 500.0)}
    f = mix_finding(MixParams(), runs, SEPARATED)
    assert f.holds and f.note == ""


def test_batch_within_ten_percent_of_separated_is_happy():
    runs = {"mixed, 16 slots, tiers premium/basic": deployment(60.0, 920.0)}
    assert not mix_finding(MixParams(), runs, SEPARATED).holds


def test_separation_missing_the_promise_does_not_hold():
    runs = {"mixed, 64 slots": deployment(3000.0, 4000.0)}
    f = mix_finding(MixParams(), runs, {**SEPARATED, "interactive_p99_ttft_ms": 900.0})
    assert not f.holds and "separated" in f.note
