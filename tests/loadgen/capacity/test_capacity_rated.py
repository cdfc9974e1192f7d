"""What ``capacity.run`` makes of the search: the rating is the offered rate of the deciding steps (the
requested load kept beside it), the interval from ``capacity.rating``, a verdict resting on a disturbed
step is ``invalid`` (``slobench capacity`` exits 3)."""

from __future__ import annotations

import json

import pytest

from loadgen.capacity.run import build_summary, disturbance, offered_rate, over_budget, rate_interval
from loadgen.capacity.search import CapacitySearch
from loadgen.capacity.search_steps import StepResult
from loadgen.capacity.settings import CapacitySettings
from loadgen.scenario.parse import load_scenario
from tests.helpers import slobench

from .test_capacity_rating import LOADS, curve_steps


@pytest.fixture
def settings(tmp_path):
    return rated_settings(tmp_path)


def rated_settings(tmp_path):
    """One-tier capacity settings (standard p99 TTFT 300 ms, a ramp from 2 req/s on common arrivals)."""
    p = tmp_path / "s.yaml"
    p.write_text("name: r\nworkload: {input_len: 8, output_len: 4}\ntiers: {standard: {slo: {ttft_ms: 300}}}\n"
                 "search: {start: 2, growth: 2, tolerance: 0.05, arrivals: common}\nclient: {lateness_bound_ms: 10}\n")
    return CapacitySettings.from_scenario(load_scenario(p))


def detail(load, draw, *, late_ms=1.0, sparse=0.88):
    """A step's detail: draw 0 happens to be sparse (88 % of the requested rate offered), others exact."""
    off = load * (sparse if draw == 0 else 1.0)
    return {"index": None, "load": load, "offered_rps": off, "window_s": [3.0, 13.0], "requests": round(off * 10),
            "valid": late_ms <= 10, "throughput_rps": off, "summary": {"client_lateness": {"p99_ms": late_ms}},
            "tiers": {}, "concurrency_measured": 2.0, "concurrency_littles_law": 2.0, "concurrency_agree": True}


def search(settings, passes, late=lambda load, draw: 1.0):
    s = CapacitySearch(settings.search)

    def measure(load, phase, draw):
        d = detail(load, draw, late_ms=late(load, draw))
        return StepResult(passes(load), detail=d, disturbed=disturbance(d, settings.lateness_bound_ms))

    return s.run(measure, draws=True)


def test_the_rating_is_the_offered_rate_of_the_deciding_steps(settings):
    out = search(settings, lambda load: load <= 10)
    s = build_summary(settings, out, meta={"kind": "capacity"}, duration_s=1.0, complete=True, stopped=None)
    rc = s["rated_capacity"]
    assert s["verdict"] == "rated" and s["confirmed"] and rc["confirmed"]
    assert rc["requested_rps"] == out.rated_load <= 10
    # the pass end on draw 0 (88 %) and its confirmation on draw 1 (100 %), pooled over equal windows
    assert rc["rate_rps"] == pytest.approx(out.rated_load * (0.88 + 1.0) / 2)
    assert rc["spec_rate_rps"] == pytest.approx(0.8 * rc["rate_rps"])
    assert rc["window_s"] == 10.0  # the deciding windows' judged length (3 s to 13 s)
    assert sorted(rc["steps"]) == sorted(i for i in out.deciding if out.steps[i].load == out.rated_load)
    assert s["verdict_text"].startswith(f"rated capacity {rc['rate_rps']:.3g} req/s offered (requested ")
    steps = s["steps"]
    assert [st["draw"] for st in steps if st["phase"] == "confirm"] == [1, 2]
    assert all(st["counted"] and st["attempt"] == 1 for st in steps) and s["valid"]
    json.dumps(s, allow_nan=False)


def test_the_headline_is_the_offered_rate_in_the_verdict_and_printed_once(settings, capsys, monkeypatch):
    from loadgen.commands.capacity import print_verdict

    out = search(settings, lambda load: load <= 10)  # draw 0 offers 88 % of the requested rate
    s = build_summary(settings, out, meta={}, duration_s=1.0, complete=True, stopped=None)
    rc = s["rated_capacity"]
    assert rc["rate_rps"] < rc["requested_rps"]
    head = f"rated capacity {rc['rate_rps']:.3g} req/s offered (requested {rc['requested_rps']:.3g} req/s)"
    assert s["headline"] == head and s["verdict_text"].startswith(head + ": every SLO held at ")
    assert f"{rc['requested_rps']:.3g} req/s requested and broke at" in s["search_text"]
    assert "rated capacity" not in s["search_text"]
    monkeypatch.setenv("COLUMNS", "400")
    print_verdict(s)
    printed = capsys.readouterr().out
    assert printed.count("rated capacity") == 1 and printed.splitlines()[0].startswith(head)
    assert f"search: {s['search_text']}" in printed


def test_offered_rate_pools_windows():
    assert offered_rate([{"offered_rps": 10.0, "window_s": [0, 10]}, {"offered_rps": 20.0, "window_s": [0, 30]}]) \
        == pytest.approx(17.5)
    assert offered_rate([{"requests": 50, "window_s": [2, 12]}]) == 5.0
    assert offered_rate([{}]) is None


def test_disturbance_from_the_detail_or_the_lateness():
    assert disturbance({"disturbed": True, "disturbance": "event-loop p99 lag 80 ms"}, 10) == "event-loop p99 lag 80 ms"
    why = disturbance({"valid": False, "summary": {"client_lateness": {"p99_ms": 42.0}}}, 10)
    assert why == "client p99 lateness 42.0 ms over the 10 ms bound"
    assert disturbance({"valid": True, "disturbed": False}, 10) is None


def test_a_stall_in_the_first_step_is_re_measured_not_rated_low(settings):
    seen = set()

    def late(load, draw):  # the load generator stalls in the very first step only
        first = (load, draw) not in seen
        seen.add((load, draw))
        return 500.0 if load == 2 and first else 1.0

    out = search(settings, lambda load: load <= 10, late)
    s = build_summary(settings, out, meta={}, duration_s=1.0, complete=True, stopped=None)
    st0, st1 = s["steps"][:2]
    assert st0["disturbance"].startswith("client p99 lateness 500.0 ms") and not st0["counted"]
    assert st1["remeasured_of"] == 0 and st1["attempt"] == 2 and st1["counted"]
    assert s["verdict"] == "rated" and s["valid"] and s["rated_capacity"]["requested_rps"] > 9
    assert s["lateness"]["disturbed_steps"] == [0]


def test_a_verdict_resting_on_a_disturbed_step_is_invalid(settings):
    # every attempt at a load near the top of the passing range stays late: the pass end rests on one
    out = search(settings, lambda load: load <= 10, lambda load, draw: 50.0 if 9 < load <= 10 else 1.0)
    s = build_summary(settings, out, meta={}, duration_s=1.0, complete=True, stopped=None)
    assert s["verdict"] == "invalid" and s["search_verdict"] == "rated" and not s["valid"]
    assert "still disturbed after 2 re-measure(s)" in s["invalid_reason"]
    assert "could not keep the schedule" in s["invalid_reason"] and s["verdict_text"].startswith("INVALID")
    assert s["rated_capacity"] is not None  # the numbers are kept, the verdict says not to trust them


def test_over_budget_takes_the_longest_full_step_as_the_next_ones_length(tmp_path):
    p = tmp_path / "b.yaml"
    p.write_text("name: b\nworkload: {input_len: 8, output_len: 4}\ntiers: {standard: {slo: {ttft_ms: 300}}}\n"
                 "search: {step_duration_s: 10, max_duration_s: 60}\n")
    settings = CapacitySettings.from_scenario(load_scenario(p))
    assert over_budget(settings, 49.0, []) is None  # 49 + 10 (step_duration_s) fits in 60
    assert over_budget(settings, 49.0, [12.0, 4.0]) == ("the time budget ended the search (search.max_duration_s "
                                                    "60 s: 49 s in, the next step would take about 12 s)")
    assert over_budget(settings, 51.0, []) is not None
    p.write_text(p.read_text().replace(", max_duration_s: 60", ""))
    assert over_budget(CapacitySettings.from_scenario(load_scenario(p)), 1e6, [1e6]) is None  # no budget: never


def test_rate_interval_from_the_summary(settings):
    steps = curve_steps(LOADS, 3)
    s = {"search_verdict": "rated", "steps": steps}
    iv = rate_interval(settings, s)
    assert iv["ci_low"] < 10 < iv["ci_high"] and "dispersion from the windows" in iv["method"]
    assert rate_interval(settings, {"search_verdict": "never_met", "steps": steps}) is None


def test_capacity_exits_3_when_the_verdict_rests_on_a_disturbed_step(mock_server, tmp_path):
    """A lateness bound no client can keep (1 µs): the one step and both its re-measures are disturbed."""
    url = mock_server("--ttft-ms", 5, "--itl-ms", 1)
    p = tmp_path / "scn.yaml"
    p.write_text("name: cap-late\nworkload: {input_len: 8, output_len: 4}\ntiers: {standard: {slo: {ttft_ms: 300}}}\n"
                 "search: {start: 5, growth: 2, max_load: 5, step_duration_s: 1.5, warmup_s: 0.5, early_pass: false}\n"
                 "client: {lateness_bound_ms: 0.001}\n")
    r = slobench("capacity", p, "--target", url, "--out", tmp_path / "run", "--no-progress", "--no-report")
    assert r.returncode == 3, r.stderr[-2000:]
    assert "invalid capacity run (exit 3)" in r.stderr and "Traceback" not in r.stderr
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert s["verdict"] == "invalid" and s["search_verdict"] == "never_broke" and not s["valid"]
    assert [st["attempt"] for st in s["steps"]] == [1, 2, 3] and [st["remeasured_of"] for st in s["steps"]] == \
        [None, 0, 1]
    assert [st["counted"] for st in s["steps"]] == [False, False, True]


def test_help_names_the_exit_codes():
    from loadgen.cli import build_parser
    from loadgen.commands.capacity import EXIT_INVALID

    sub = next(a for a in build_parser()._actions if a.dest == "cmd")
    text = sub.choices["capacity"].format_help()
    assert EXIT_INVALID == 3 and "3 verdict invalid" in " ".join(text.split()) and "130 Ctrl-C" in text
