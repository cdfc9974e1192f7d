"""`slobench watch`: the signals read from scrapes, the deviation tracker on synthetic looks (sustain window,
direction, the under-load rule), the baseline read from a capacity run folder, the watch loop on a scripted
target, and the command against the mock server and the embedded reference engine with a deviation
injected (exit 1) and without (exit 0)."""

from __future__ import annotations

import io
import json
import math

import pytest

from loadgen.commands.common import UsageError
from loadgen.monitoring.baseline import BaselineError, load_baseline
from loadgen.monitoring.readings import bucket_deltas, histogram_quantile, read
from loadgen.monitoring.signals import BATCH_FILL, FLAVORS, KV, REJECTIONS, TOKEN_RATE, TTFT, detect_flavor
from loadgen.monitoring.tracker import DEVIATING, IDLE, NO_BASELINE, NO_DATA, OK, SUSTAINED, DeviationTracker
from loadgen.monitoring.watch import WatchOptions, watch
from tests.monitoring_helpers import Load, capacity_summary, run_watch, write_run

BOUNDS = (0.01, 0.1, 0.25, 0.5, 1.0, math.inf)


def hist(name: str, counts: dict[float, float], labels: str = 'model_name="m"') -> dict[str, float]:
    """A histogram's series as the scraper keys them: cumulative buckets (``counts``: observations per bucket),
    _count and _sum (at each bucket's bound)."""
    out, cum, total = {}, 0.0, 0.0
    for le in BOUNDS:
        cum += counts.get(le, 0.0)
        total += counts.get(le, 0.0) * (le if math.isfinite(le) else 2.0)
        le_text = "+Inf" if math.isinf(le) else repr(le)
        out[f'{name}_bucket{{le="{le_text}",{labels}}}'] = cum
    out[f"{name}_count{{{labels}}}"], out[f"{name}_sum{{{labels}}}"] = cum, total
    return out


def vllm_sample(ttft_counts, gen, running, waiting, kv) -> dict[str, float]:
    lab = 'engine="0",model_name="m"'
    return {**hist("vllm:time_to_first_token_seconds", ttft_counts, lab),
            f"vllm:generation_tokens_total{{{lab}}}": gen, f"vllm:num_requests_running{{{lab}}}": running,
            f"vllm:num_requests_waiting{{{lab}}}": waiting, f"vllm:kv_cache_usage_perc{{{lab}}}": kv}


# ----------------------------------------------------------------------------------------------- readings

def test_histogram_quantile_interpolates_inside_its_bucket_as_prometheus_does():
    cum = {0.1: 50.0, 0.2: 100.0, math.inf: 100.0}
    assert histogram_quantile(0.5, cum) == pytest.approx(0.1)
    assert histogram_quantile(0.75, cum) == pytest.approx(0.15)
    assert histogram_quantile(0.25, cum) == pytest.approx(0.05)  # the lowest bucket from 0
    assert histogram_quantile(0.99, {0.1: 10.0, math.inf: 20.0}) == pytest.approx(0.1)  # in +Inf: the last bound
    assert histogram_quantile(0.5, {0.1: 0.0, math.inf: 0.0}) is None


def test_bucket_deltas_sum_the_labelled_series_and_count_from_a_reset():
    a = {**hist("h", {0.1: 2}, 'tier="premium"'), **hist("h", {0.5: 1}, 'tier="standard"')}
    b = {**hist("h", {0.1: 5}, 'tier="premium"'), **hist("h", {0.5: 4, 1.0: 1}, 'tier="standard"')}
    d = bucket_deltas(a, b, "h")
    assert d[0.1] == 3 and d[0.5] == 6 and d[1.0] == 7 and d[math.inf] == 7
    assert bucket_deltas(b, a, "h") == bucket_deltas({}, a, "h")  # counts fell: a restart, counted from 0


def test_read_takes_rates_from_counter_deltas_and_gauges_as_window_means():
    window = [(0.0, vllm_sample({0.1: 10}, 1000, 4, 0, 0.2)),
              (1.0, vllm_sample({0.1: 10, 0.25: 10}, 1500, 8, 2, 0.4)),
              (2.0, vllm_sample({0.1: 10, 0.25: 10, 0.5: 10}, 2000, 12, 4, 0.6))]
    r = read(window, FLAVORS["vllm"], max_num_seqs=16)
    assert r.values[TOKEN_RATE.key] == pytest.approx(500.0)  # (2000 - 1000) / 2 s
    assert r.values[KV.key] == pytest.approx(0.4)
    assert r.values[BATCH_FILL.key] == pytest.approx(8 / 16)  # mean running / max_num_seqs
    assert r.waiting == pytest.approx(2.0) and r.ttft_requests == 20
    # 20 new observations: 10 in (0.1, 0.25], 10 in (0.25, 0.5]; p99 at rank 19.8 of (0.25, 0.5]
    assert r.values[TTFT.key] == pytest.approx(1000 * (0.25 + 0.25 * 9.8 / 10))
    assert r.ttft_p50_ms == pytest.approx(250.0)
    assert r.values[REJECTIONS.key] is None  # vLLM has no rejection counter
    assert read(window, FLAVORS["vllm"]).values[BATCH_FILL.key] is None  # no batch capacity known


def test_the_reference_engine_page_is_read_in_its_own_names():
    def sample(rej, fill_p, fill_s):
        return {**hist("slobench:time_to_first_token_seconds", {0.01: 4}, 'model_name="m",tier="premium"'),
                'slobench:admission_rejections_total{model_name="m",tier="standard"}': rej,
                'slobench:batch_fill_ratio{model_name="m",tier="premium"}': fill_p,
                'slobench:batch_fill_ratio{model_name="m",tier="standard"}': fill_s,
                'slobench:generation_tokens_total{model_name="m",tier="premium"}': 0.0,
                'vllm:num_requests_running{engine="0",model_name="m"}': 3.0}
    first, last = sample(2, 0.25, 0.25), sample(12, 0.5, 0.25)
    names = detect_flavor(last)
    assert names is FLAVORS["slobench"]
    r = read([(0.0, first), (4.0, last)], names)
    assert r.values[REJECTIONS.key] == pytest.approx(2.5)  # 10 rejections in 4 s
    assert r.values[BATCH_FILL.key] == pytest.approx((0.5 + 0.75) / 2)  # tiers summed, window mean
    assert r.values[TTFT.key] is None and r.ttft_requests == 0  # no first token in the window


def test_the_server_is_told_by_its_names():
    assert detect_flavor(vllm_sample({}, 0, 0, 0, 0)) is FLAVORS["vllm"]
    assert detect_flavor({**hist("sglang:time_to_first_token_seconds", {})}) is FLAVORS["sglang"]
    assert detect_flavor({"process_cpu_seconds_total": 1.0}) is None


# ------------------------------------------------------------------------------------------------ tracker

def looks(tracker: DeviationTracker, key: str, seq, under_load: bool = True) -> list[str]:
    return [tracker.update(t, {key: v}, under_load)[key].state for t, v in seq]


def test_a_deviation_is_sustained_only_once_it_has_lasted_the_sustain_time():
    tr = DeviationTracker({TTFT.key: 100.0}, tolerance=0.25, sustain_s=3.0)  # limit 130 ms
    states = looks(tr, TTFT.key, [(0, 90), (1, 200), (2, 200), (3, 200), (4, 200), (5, 120)])
    assert states == [OK, DEVIATING, DEVIATING, DEVIATING, SUSTAINED, OK]
    assert tr.sustained == {TTFT.key}


def test_a_look_back_inside_the_tolerance_starts_the_sustain_window_again():
    tr = DeviationTracker({TTFT.key: 100.0}, tolerance=0.25, sustain_s=3.0)
    states = looks(tr, TTFT.key, [(0, 200), (1, 200), (2, 200), (2.5, 129), (3, 200), (4, 200), (5, 200)])
    assert states == [DEVIATING, DEVIATING, DEVIATING, OK, DEVIATING, DEVIATING, DEVIATING]
    assert tr.sustained == set()


def test_direction_higher_is_bad_for_ttft_kv_and_rejections_lower_for_token_rate_and_fill():
    base = {TTFT.key: 100.0, KV.key: 0.5, REJECTIONS.key: 0.0, TOKEN_RATE.key: 1000.0, BATCH_FILL.key: 0.8}
    tr = DeviationTracker(base, tolerance=0.25, sustain_s=0.0)
    good = tr.update(0, {TTFT.key: 10.0, KV.key: 0.01, REJECTIONS.key: 0.0, TOKEN_RATE.key: 5000.0,
                         BATCH_FILL.key: 1.0}, under_load=True)
    assert {j.state for j in good.values()} == {OK}
    bad = tr.update(1, {TTFT.key: 131.0, KV.key: 0.66, REJECTIONS.key: 0.2, TOKEN_RATE.key: 740.0,
                        BATCH_FILL.key: 0.57}, under_load=True)
    assert {j.state for j in bad.values()} == {SUSTAINED}


def test_low_token_rate_or_fill_without_load_is_light_traffic_not_a_deviation():
    tr = DeviationTracker({TOKEN_RATE.key: 1000.0}, tolerance=0.25, sustain_s=2.0)
    states = looks(tr, TOKEN_RATE.key, [(0, 10.0), (1, 10.0), (2, 10.0), (3, 10.0)], under_load=False)
    assert states == [IDLE] * 4
    # under load from t=4: the low rate counts from then on, not from t=0
    states = looks(tr, TOKEN_RATE.key, [(4, 10.0), (5, 10.0), (6, 10.0)], under_load=True)
    assert states == [DEVIATING, DEVIATING, SUSTAINED]


def test_the_floor_keeps_a_zero_baseline_from_turning_noise_into_a_deviation():
    tr = DeviationTracker({REJECTIONS.key: 0.0}, tolerance=0.25, sustain_s=0.0)
    assert looks(tr, REJECTIONS.key, [(0, 0.05), (1, 0.5)]) == [OK, SUSTAINED]


def test_a_look_without_data_neither_starts_nor_ends_a_deviation():
    tr = DeviationTracker({TTFT.key: 100.0, KV.key: None}, tolerance=0.25, sustain_s=2.0)
    assert looks(tr, TTFT.key, [(0, None), (1, 300), (2, None), (3, 300)]) == [NO_DATA, DEVIATING, DEVIATING,
                                                                               SUSTAINED]
    assert looks(tr, KV.key, [(4, 0.99), (10, 0.99)]) == [NO_BASELINE, NO_BASELINE]  # nothing to judge against
    assert tr.sustained == {TTFT.key}


# ----------------------------------------------------------------------------------------------- baseline

def test_the_baseline_is_the_rated_step_and_says_where_each_figure_comes_from(tmp_path):
    run = write_run(tmp_path / "run", ttft_p99_ms=250.0, output_tok_s=900.0, kv_usage=0.2, batch_fill=0.5,
                    rejections=10, running=12.0, max_num_seqs=32)
    b = load_baseline(run)
    assert (b.step, b.load, b.running, b.max_num_seqs) == (1, 8.0, 12.0, 32)
    assert b.value(TTFT.key) == 250.0 and b.value(TOKEN_RATE.key) == 900.0 and b.value(KV.key) == 0.2
    assert b.value(BATCH_FILL.key) == 0.5 and b.value(REJECTIONS.key) == pytest.approx(10 / 20.0)
    assert b.figures[TTFT.key].source == "summary.json steps[1].summary.p99_ttft_ms"
    assert b.figures[REJECTIONS.key].source == ("summary.json steps[1].admission_rejections / "
                                                "summary.json steps[1].duration_s")
    assert load_baseline(run / "summary.json").step == 1  # the summary itself will do


def test_without_rated_capacity_step_the_highest_passing_step_is_the_baseline(tmp_path):
    s = capacity_summary(ttft_p99_ms=100.0)
    del s["rated_capacity"]["step"]
    (tmp_path / "summary.json").write_text(json.dumps(s))
    assert load_baseline(tmp_path).step == 1 and load_baseline(tmp_path).value(TTFT.key) == 100.0


@pytest.mark.parametrize("summary, message", [
    ({"kind": "run", "requests": 10}, "not a capacity run"),
    ({"kind": "capacity", "verdict": "never_met", "steps": [{"index": 0, "load": 4.0, "passed": False}]},
     "no rated step"),
])
def test_a_folder_without_a_rated_step_is_no_baseline(tmp_path, summary, message):
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(BaselineError, match=message):
        load_baseline(tmp_path)
    with pytest.raises(BaselineError, match="missing: not found"):
        load_baseline(tmp_path / "missing")


# ----------------------------------------------------------------------------------- the loop, scripted

class Scripted:
    """A target whose scrapes are scripted, on a virtual clock that ``sleep`` advances."""

    def __init__(self, samples):
        self.samples, self.now, self.calls = list(samples), 0.0, 0

    def clock(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s

    def scrape(self):
        self.calls += 1
        item = self.samples[min(self.calls, len(self.samples) - 1)]
        if isinstance(item, BaseException):
            raise item
        return item


def ttft_rising(n: int, slow_from: int) -> list[dict[str, float]]:
    """Cumulative vLLM samples, 10 first tokens a look: under 10 ms, then at 0.25-0.5 s from ``slow_from``."""
    out, fast, slow = [], 0, 0
    for i in range(n):
        if i >= slow_from:
            slow += 10
        else:
            fast += 10
        out.append(vllm_sample({0.01: fast, 0.5: slow}, 100 * i, 2, 0, 0.1))
    return out


def scripted_watch(tmp_path, samples, **opts) -> tuple[int, list[dict], Scripted]:
    target = Scripted(samples)
    out = io.StringIO()
    b = load_baseline(write_run(tmp_path / "base", ttft_p99_ms=20.0, kv_usage=0.5))
    o = WatchOptions(**{"interval_s": 1.0, "window_s": 2.0, "sustain_s": 3.0, "json": True, **opts})
    code = watch("http://scripted", target.scrape, FLAVORS["vllm"], b, o, samples[0], out=out, clock=target.clock,
                 sleep=target.sleep)
    return code, [json.loads(line) for line in out.getvalue().splitlines()], target


def test_the_loop_exits_1_once_a_deviation_is_sustained_and_0_while_none_is(tmp_path):
    code, lines, _ = scripted_watch(tmp_path, ttft_rising(20, slow_from=8), duration_s=15.0)
    states = [line["signals"][TTFT.key]["state"] for line in lines[:-1]]
    assert code == 1 and lines[-1]["end"] and lines[-1]["sustained"] == [TTFT.key]
    assert states[:7] == [OK] * 7 and SUSTAINED in states[8:]
    first_sustained = states.index(SUSTAINED)
    assert lines[first_sustained]["signals"][TTFT.key]["for_s"] >= 3.0
    code, lines, _ = scripted_watch(tmp_path, ttft_rising(20, slow_from=100), duration_s=15.0)
    assert code == 0 and lines[-1]["sustained"] == [] and len(lines) == 16  # 15 looks and the end line


def test_fail_fast_stops_at_the_first_sustained_deviation(tmp_path):
    code, lines, target = scripted_watch(tmp_path, ttft_rising(40, slow_from=2), duration_s=30.0, fail_fast=True)
    assert code == 1 and lines[-2]["signals"][TTFT.key]["state"] == SUSTAINED and target.calls < 10


def test_once_judges_its_one_look_without_a_sustain_time(tmp_path):
    code, lines, target = scripted_watch(tmp_path, ttft_rising(3, slow_from=1), once=True)
    assert code == 1 and target.calls == 1 and len(lines) == 2 and lines[-1]["sustained"] == [TTFT.key]
    code, lines, _ = scripted_watch(tmp_path, ttft_rising(3, slow_from=5), once=True)
    assert code == 0 and lines[0]["signals"][TTFT.key]["state"] == OK


def test_a_target_lost_for_the_sustain_time_ends_the_watch_with_1(tmp_path):
    samples = [*ttft_rising(3, slow_from=10), *[ConnectionRefusedError("refused")] * 10]
    code, lines, _ = scripted_watch(tmp_path, samples, duration_s=30.0)
    assert code == 1 and any("ConnectionRefusedError" in line.get("error", "") for line in lines)
    assert lines[-1]["verdict"].startswith("target unreachable") and lines[-1]["sustained"] == []


def test_once_with_its_second_scrape_failed_is_a_lost_target(tmp_path):
    code, lines, target = scripted_watch(tmp_path, [*ttft_rising(1, slow_from=5), OSError("reset")], once=True)
    assert code == 1 and target.calls == 1 and lines[-1]["verdict"].startswith("target unreachable")


def test_failed_scrapes_past_the_duration_end_the_watch_without_a_verdict_of_loss(tmp_path):
    samples = [*ttft_rising(3, slow_from=10), *[OSError("reset")] * 3, *ttft_rising(20, slow_from=100)[3:]]
    code, lines, target = scripted_watch(tmp_path, samples, duration_s=4.0, sustain_s=30.0)
    assert code == 0 and target.calls == 4 and lines[-1]["verdict"] == "no sustained deviation"


def test_ctrl_c_ends_the_watch_cleanly_with_the_verdict_so_far(tmp_path):
    samples = [*ttft_rising(3, slow_from=10), KeyboardInterrupt()]
    code, lines, _ = scripted_watch(tmp_path, samples, duration_s=30.0)
    assert code == 0 and lines[-1]["end"] and lines[-1]["verdict"] == "no sustained deviation"


# ------------------------------------------------------------------------------------ the command's input

def test_bad_input_is_a_one_line_usage_error(tmp_path):
    run = write_run(tmp_path / "run")
    with pytest.raises(UsageError, match="not an http"):
        run_watch("localhost:8000", "--baseline", run)
    with pytest.raises(UsageError, match="--interval must be above 0"):
        run_watch("http://127.0.0.1:1", "--baseline", run, "--interval", "0")
    with pytest.raises(UsageError, match="baseline .*nothing: not found"):
        run_watch("http://127.0.0.1:1", "--baseline", tmp_path / "nothing")
    with pytest.raises(UsageError, match="required: --baseline"):
        run_watch("http://127.0.0.1:1")


def test_an_unreachable_target_is_a_clear_error(tmp_path):
    from loadgen.target.embedded import free_port

    with pytest.raises(UsageError, match=r"cannot scrape http://127\.0\.0\.1:\d+/metrics: .*refused"):
        run_watch(f"http://127.0.0.1:{free_port()}", "--baseline", write_run(tmp_path / "run"), "--once")


# ------------------------------------------------------------------------------------ against the mock

WATCH_FAST = ("--interval", "0.25", "--window-s", "1.5", "--sustain-s", "1", "--duration", "3.5")


def test_watch_the_queueing_mock_overloaded_exits_1_on_ttft_and_token_rate(mock_server, tmp_path):
    # one slot, 50 ms a request, six users: each waits for the five ahead of it, TTFT ~0.3 s against 20 ms
    url = mock_server("--metrics-flavor", "sglang", "--slots", 1, "--ttft-ms", 5, "--itl-ms", 5, "--tokens", 10)
    run = write_run(tmp_path / "base", ttft_p99_ms=20.0, output_tok_s=1000.0, kv_usage=0.5, batch_fill=0.9,
                    max_num_seqs=1)
    with Load(url, users=6):
        code, lines = run_watch(url, "--baseline", run, *WATCH_FAST)
    looks, end = lines[:-1], lines[-1]
    assert code == 1 and end["exit"] == 1
    assert set(end["sustained"]) == {TTFT.key, TOKEN_RATE.key}
    assert {look["server"] for look in looks} == {"sglang"} and looks[-1]["under_load"] is True
    assert looks[-1]["signals"][TTFT.key]["value"] > 100.0
    assert looks[-1]["signals"][KV.key]["state"] == NO_DATA  # the mock's SGLang page has no KV gauge


def test_watch_the_mock_within_its_baseline_exits_0(mock_server, tmp_path):
    url = mock_server("--metrics-flavor", "sglang", "--slots", 1, "--ttft-ms", 5, "--itl-ms", 5, "--tokens", 10)
    # the same load judged against a baseline it keeps: TTFT well under, tokens/s and fill above the limits
    run = write_run(tmp_path / "base", ttft_p99_ms=2000.0, output_tok_s=100.0, kv_usage=0.5, batch_fill=0.8,
                    max_num_seqs=1)
    with Load(url, users=6):
        code, lines = run_watch(url, "--baseline", run, *WATCH_FAST)
    last = lines[-2]
    assert code == 0 and lines[-1]["sustained"] == []
    assert last["under_load"] is True
    assert {k: last["signals"][k]["state"] for k in (TTFT.key, TOKEN_RATE.key, BATCH_FILL.key)} == dict.fromkeys(
        (TTFT.key, TOKEN_RATE.key, BATCH_FILL.key), OK)
    assert last["signals"][BATCH_FILL.key]["value"] > 0.9  # one slot, always busy


# ------------------------------------------------------------------------ against the embedded engine

TWO_SLOTS = pytest.mark.parametrize("embedded_engine", [{"max_num_seqs": 2}], indirect=True, ids=["two-slots"])


@pytest.mark.slow
@TWO_SLOTS
def test_watch_the_engine_queued_past_its_baseline_exits_1(embedded_engine, tmp_path):
    # two batch slots, eight users of 32 tokens each: requests queue, TTFT far over a 10 ms baseline
    run = write_run(tmp_path / "base", ttft_p99_ms=10.0, output_tok_s=1.0, kv_usage=0.9, batch_fill=0.01)
    with Load(embedded_engine, users=8, max_tokens=32, model="tiny"):
        code, lines = run_watch(embedded_engine, "--baseline", run, *WATCH_FAST)
    looks = lines[:-1]
    assert code == 1 and TTFT.key in lines[-1]["sustained"]
    assert {look["server"] for look in looks} == {"slobench"}
    assert looks[-1]["signals"][TTFT.key]["value"] > 17.5  # the limit: 10 x 1.25 + 5
    assert looks[-1]["signals"][BATCH_FILL.key]["state"] == OK  # both slots busy: above a 0.01 baseline


@pytest.mark.slow
@TWO_SLOTS
def test_watch_the_engine_within_its_baseline_exits_0(embedded_engine, tmp_path):
    run = write_run(tmp_path / "base", ttft_p99_ms=5000.0, output_tok_s=1.0, kv_usage=0.9, batch_fill=0.01,
                    running=100.0)
    with Load(embedded_engine, users=1, max_tokens=16, model="tiny"):
        code, lines = run_watch(embedded_engine, "--baseline", run, *WATCH_FAST)
    last = lines[-2]
    assert code == 0 and lines[-1]["sustained"] == []
    assert last["signals"][TTFT.key]["state"] == OK and last["ttft_requests"] > 0
    assert last["signals"][KV.key]["state"] == OK and last["signals"][REJECTIONS.key]["state"] == OK


@pytest.mark.parametrize("flavor, read", [
    ("vllm", {TOKEN_RATE.key, BATCH_FILL.key}),  # the mock's vLLM page has no TTFT histogram or KV gauge
    ("sglang", {TTFT.key, TOKEN_RATE.key, BATCH_FILL.key}),
    ("tgi", {BATCH_FILL.key}),
    ("trtllm", {TTFT.key, TOKEN_RATE.key, BATCH_FILL.key}),  # its page at /prometheus/metrics
])
def test_each_servers_page_gives_the_signals_its_names_map_to(mock_server, tmp_path, flavor, read):
    url = mock_server("--metrics-flavor", flavor, "--ttft-ms", 5, "--itl-ms", 2, "--tokens", 5)
    run = write_run(tmp_path / "base", max_num_seqs=4)
    with Load(url, users=2):
        _, lines = run_watch(url, "--baseline", run, "--once", "--interval", "0.5")
    (look, end) = lines
    assert look["server"] == flavor and end["looks"] == 1
    assert {k for k, s in look["signals"].items() if s["source"]} == read
