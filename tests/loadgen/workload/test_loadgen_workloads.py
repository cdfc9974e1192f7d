import numpy as np
import pytest

from loadgen.results.summary import parse_goodput, summarize
from loadgen.scenario.model import ScenarioError
from loadgen.scenario.parse import parse_scenario
from loadgen.workload.arrivals import Arrivals
from loadgen.workload.synthetic import Conversations, LengthDist, SharedPrefix, SyntheticWorkload


def test_poisson_mean_rate_and_exponential_gaps():
    t = Arrivals("poisson", rate=50.0).times(n=20_000, seed=1)
    gaps = np.diff(t)
    assert (len(t) - 1) / (t[-1] - t[0]) == pytest.approx(50.0, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.05)  # CV of exponential gaps is 1


@pytest.mark.parametrize("burstiness", [0.25, 1.0, 4.0])
def test_gamma_rate_and_coefficient_of_variation(burstiness):
    t = Arrivals("gamma", rate=20.0, burstiness=burstiness).times(n=20_000, seed=2)
    gaps = np.diff(t)
    assert 1 / gaps.mean() == pytest.approx(20.0, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(1 / np.sqrt(burstiness), rel=0.06)


def test_schedules_are_reproducible_from_the_seed():
    a = Arrivals("gamma", rate=10.0, burstiness=0.5)
    np.testing.assert_array_equal(a.times(n=500, seed=7), a.times(n=500, seed=7))
    assert not np.array_equal(a.times(n=500, seed=7), a.times(n=500, seed=8))
    w = SyntheticWorkload(input_len=LengthDist("lognormal", mean=100, sigma=0.7),
                          shared_prefix=SharedPrefix(3, 16, 0.5), tiers={"premium": 1, "basic": 2})
    s1, s2 = w.generate(a.times(n=50, seed=7), seed=7), w.generate(a.times(n=50, seed=7), seed=7)
    assert [(s.prompt, s.max_tokens, s.tier) for s in s1] == [(s.prompt, s.max_tokens, s.tier) for s in s2]


@pytest.mark.parametrize("kind", ["poisson", "gamma", "constant"])
def test_exact_counts_hold_at_every_mark_and_the_schedule_does_not_depend_on_its_length(kind):
    a = Arrivals(kind, rate=55.0, burstiness=0.5)
    marks = (3.0, 4.0, 5.0, 6.0, 20.0)
    t = a.times(duration_s=30.0, seed=3, exact_at=marks)
    assert [int((t < m).sum()) for m in marks] == [round(55.0 * m) for m in marks]
    assert np.all(np.diff(t) >= 0) and t[-1] < 30.0
    longer = a.times(duration_s=80.0, seed=3, exact_at=marks)  # a lengthened step sends the same first 30 s
    np.testing.assert_array_equal(longer[:len(t)], t)
    assert int((longer < 30.0).sum()) == len(t)
    with pytest.raises(ValueError, match="marks must be > 0"):
        a.times(duration_s=10.0, exact_at=(0.0, 5.0))


def test_exact_poisson_counts_spread_evenly_between_marks_and_run_free_after_the_last():
    """Between two marks: the Poisson process conditioned on its count (uniform over the stretch); after the
    last mark the count is the process's own again."""
    runs = [Arrivals("poisson", rate=50.0).times(duration_s=20.0, seed=s, exact_at=(10.0,)) for s in range(200)]
    assert {int((t < 10.0).sum()) for t in runs} == {500}
    hist = np.histogram(np.concatenate([t[t < 10.0] for t in runs]), bins=10, range=(0.0, 10.0))[0]
    assert hist.min() > 0.95 * hist.mean() and hist.max() < 1.05 * hist.mean(), hist
    after = np.array([int((t >= 10.0).sum()) for t in runs])
    assert after.mean() == pytest.approx(500, rel=0.02) and after.std() == pytest.approx(np.sqrt(500), rel=0.2)
    drawn = [int((Arrivals("poisson", rate=50.0).times(duration_s=10.0, seed=s) < 10.0).sum()) for s in range(20)]
    assert len(set(drawn)) > 10  # without marks the count is drawn


def test_constant_and_duration_bounded_schedules():
    t = Arrivals("constant", rate=4.0).times(duration_s=10.0)
    np.testing.assert_allclose(t, np.arange(40) * 0.25)
    t = Arrivals("poisson", rate=100.0).times(duration_s=5.0, seed=3)
    assert t[-1] < 5.0 and 400 < len(t) < 600
    assert Arrivals("poisson", rate=100.0).times(n=10, duration_s=5.0).size == 10
    with pytest.raises(ValueError, match="rate"):
        Arrivals("poisson", rate=0)
    with pytest.raises(ValueError, match="concurrency"):
        Arrivals("closed")


@pytest.mark.parametrize(
    "dist,mean",
    [(LengthDist("fixed", value=77), 77), (LengthDist("uniform", min=10, max=30), 20),
     (LengthDist("normal", mean=200, std=20), 200), (LengthDist("lognormal", mean=300, sigma=0.5), 300),
     (LengthDist("empirical", values=[10, 20, 60]), 30)],
)
def test_length_distributions(dist, mean):
    x = dist.sample(np.random.default_rng(0), 20_000)
    assert x.min() >= 1 and x.mean() == pytest.approx(mean, rel=0.03)


def test_shared_prefixes_tiers_and_conversations():
    w = SyntheticWorkload(input_len=LengthDist("fixed", value=8), shared_prefix=SharedPrefix(2, 32, 0.75),
                          tiers={"premium": 1, "standard": 3})
    specs = w.generate(np.arange(4000) * 0.01, seed=5)
    heads = [tuple(s.prompt[:32]) for s in specs]
    shared = [h for h in heads if heads.count(h) > 1] if len(heads) < 50 else None
    from collections import Counter

    c = Counter(heads)
    top2 = c.most_common(2)
    assert sum(n for _, n in top2) / len(specs) == pytest.approx(0.75, abs=0.03)
    assert all(len(s.prompt) in (8, 40) for s in specs) and shared is None
    tiers = Counter(s.tier for s in specs)
    assert tiers["premium"] / len(specs) == pytest.approx(0.25, abs=0.03)

    conv = SyntheticWorkload(input_len=LengthDist("fixed", value=5),
                             conversations=Conversations(3, 1.0, 4, history="synthetic"))
    specs = conv.generate(np.arange(9) * 0.1, seed=0)
    c0 = sorted((s for s in specs if s.conversation == "c0"), key=lambda s: s.turn)
    assert [s.turn for s in c0] == [0, 1, 2] and not any(s.follow_up for s in c0)
    assert c0[1].prompt[: len(c0[0].prompt)] == c0[0].prompt  # each turn extends its history
    assert len(c0[1].prompt) == 5 + 4 + 5 and c0[2].arrival_s - c0[0].arrival_s == pytest.approx(2.0)

    # real history (the default): later turns carry only their user message; the driver adds the history
    real = SyntheticWorkload(input_len=LengthDist("fixed", value=5), conversations=Conversations(3, 1.0))
    r0 = sorted((s for s in real.generate(np.arange(9) * 0.1, seed=0) if s.conversation == "c0"),
                key=lambda s: s.turn)
    assert [s.follow_up for s in r0] == [False, True, True] and [len(s.prompt) for s in r0] == [5, 5, 5]
    assert r0[0].prompt == c0[0].prompt and r0[1].prompt != r0[0].prompt
    assert all(s.think_time_s == 1.0 for s in r0) and [len(s.segments) for s in r0] == [1, 1, 1]


def _rec(i, sched, first, tokens, status="ok", out=None, tier=None, sent=None, server=None, http=200):
    return {"id": f"r{i}", "stage": 0, "tier": tier, "scheduled_s": sched, "sent_s": sched if sent is None else sent,
            "first_token_s": first, "token_s": tokens, "done_s": (tokens[-1] if tokens else sched) + 0.001,
            "prompt_tokens": 10, "output_tokens": len(tokens) if out is None else out, "status": status,
            "http_status": http, "error": None if status == "ok" else "boom", "server": server}


def test_summary_formulas_match_the_design():
    recs = [
        _rec(0, 0.0, 0.1, [0.1, 0.2, 0.4], tier="premium", server={"queue_ms": 5, "prefill_ms": 50, "decode_ms": 300}),
        _rec(1, 1.0, 1.5, [1.5, 1.6], tier="standard", sent=1.02,
             server={"queue_ms": 15, "prefill_ms": 100, "decode_ms": 100}),
        _rec(2, 2.0, None, [], status="rejected", http=429, tier="standard"),
    ]
    s = summarize(recs, goodput=parse_goodput(["ttft:200"]), tier_slos={"standard": {"ttft_ms": 800}},
                  lateness_bound_ms=10)
    assert s["completed"] == 2 and s["failed"] == 1 and s["errors"] == {"rejected": 1}
    assert s["errors_by_http_status"] == {"429": 1}
    assert s["mean_ttft_ms"] == pytest.approx((100 + 500) / 2)
    assert s["median_e2el_ms"] == pytest.approx((400 + 600) / 2)
    # TPOT = (E2EL - TTFT) / (output_tokens - 1): (400-100)/2 = 150, (600-500)/1 = 100
    assert s["mean_tpot_ms"] == pytest.approx(125)
    # ITL pooled over all gaps: 100, 200, 100
    assert s["mean_itl_ms"] == pytest.approx(400 / 3)
    assert s["p99_itl_ms"] == pytest.approx(np.percentile([100, 200, 100], 99))
    assert s["duration"] == pytest.approx(2.001)
    assert s["request_goodput"] == pytest.approx(1 / 2.001)  # only r0 has TTFT <= 200
    assert s["total_output_tokens"] == 5 and s["output_throughput"] == pytest.approx(5 / 2.001)
    assert s["tiers"]["standard"]["slo_attainment"] == pytest.approx(0.5)  # the 429 counts as a miss
    assert s["breakdown"]["source"] == "server timing" and s["breakdown"]["mean_queue_ms"] == pytest.approx(10)
    assert s["client_lateness"]["max_ms"] == pytest.approx(20) and s["valid"] is False
    assert "lateness" in s["invalid_reason"]


def test_breakdown_from_scraped_histogram_deltas():
    recs = [_rec(0, 0.0, 0.1, [0.1, 0.2])]
    h = "vllm:request_queue_time_seconds"
    m = [{"t": 0, "metrics": {f"{h}_sum": 1.0, f"{h}_count": 10}},
         {"t": 5, "metrics": {f"{h}_sum": 3.0, f"{h}_count": 30}}]
    s = summarize(recs, metrics=m)
    assert "vllm:request_queue_time_seconds" in s["breakdown"].pop("source_detail")  # where it came from
    assert s["breakdown"] == {"source": "vllm histograms", "requests": 20, "mean_queue_ms": pytest.approx(100.0),
                              "mean_prefill_ms": None, "mean_network_ms": None, "mean_decode_ms": None,
                              "mean_ttft_ms": pytest.approx(100.0)}


def test_goodput_parsing_errors():
    assert parse_goodput(["ttft:300", "tpot:50", "e2el:9000"]) == {"ttft_ms": 300, "tpot_ms": 50, "e2el_ms": 9000}
    for bad in (["ttft"], ["foo:1"], ["ttft:x"], ["ttft:-1"]):
        with pytest.raises(ValueError):
            parse_goodput(bad)


def test_scenario_validation_names_the_key_path():
    good = {"workload": {"input_len": {"dist": "uniform", "min": 4, "max": 8}, "output_len": 4},
            "tiers": {"premium": {"weight": 1, "slo": {"ttft_ms": 300}}}, "load": {"rate": 2, "requests": 5}}
    s = parse_scenario(good)
    specs, info = s.build()
    assert len(specs) == 5 and s.tier_slos == {"premium": {"ttft_ms": 300.0}} and info["type"] == "synthetic"
    cases = [
        ({**good, "load": {"rate": "fast", "requests": 5}}, "load.rate: expected a number, found str 'fast'"),
        ({**good, "load": {"rate": 2}}, "load.requests: required"),
        ({**good, "workload": {"input_len": {"dist": "zipf"}}}, "workload.input_len.dist: expected one of"),
        ({**good, "tiers": {"premium": {"slo": {"ttft": 3}}}}, "tiers.premium.slo.ttft: unknown SLO"),
        ({**good, "lod": {}}, "lod: unknown key"),
        ({**good, "load": {"arrival": "closed", "requests": 5}}, "closed-loop arrivals need concurrency"),
        ({**good, "workload": {"type": "trace"}}, "workload.path: required"),
    ]
    for raw, msg in cases:
        with pytest.raises(ScenarioError) as e:
            parse_scenario(raw)
        assert msg in str(e.value), str(e.value)
