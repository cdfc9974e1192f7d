"""An SLO on the mean (``--slo tpot:50@mean``, YAML ``{threshold: 50, statistic: mean}``): its parse forms, a
step's judgement (a failed request breaks it), the certain breach on a mean, the rating at the load where
the mean crosses its threshold, the run summary's verdict apart from goodput, and one capacity search
against the mock server rated on mean SLOs alone."""

from __future__ import annotations

import csv
import io
import json
import math
from collections import Counter

import numpy as np
import pytest

from loadgen.capacity.early_stop import MEAN_MIN_SAMPLES, StepLooks, clear_pass_reason, min_samples
from loadgen.capacity.rating import rate
from loadgen.capacity.settings import CapacitySettings
from loadgen.capacity.step_stats import goodput_rps, tier_entry
from loadgen.results.records import RequestRecord
from loadgen.results.slo import SLO, breach_certain, judge, mean_slos, per_request_slos
from loadgen.results.summary import summarize
from loadgen.scenario.flags import ScenarioFlags, SloFlag, parse_slo
from loadgen.scenario.model import ScenarioError
from loadgen.scenario.parse import parse_scenario
from tests.helpers import slobench

MEAN_TPOT = SLO("tpot_ms", 50.0, statistic="mean")


def rec(i: int, s: float, tpot_ms: float, ttft_s: float = 0.05, status: str = "ok", tokens: int = 5) -> RequestRecord:
    """A request scheduled at ``s`` whose tokens come ``tpot_ms`` apart after ``ttft_s``; a failed one has none."""
    if status != "ok":
        return RequestRecord(f"r{i}", 0, "standard", s, sent_s=s, done_s=s + 0.1, status=status)
    f = s + ttft_s
    ts = [f + k * tpot_ms / 1000.0 for k in range(tokens)]
    return RequestRecord(f"r{i}", 0, "standard", s, sent_s=s, first_token_s=f, token_s=ts, done_s=ts[-1] + 0.001,
                         output_tokens=tokens, status="ok")


# ------------------------------------------------------------------ parse forms


def test_the_flag_and_the_yaml_give_a_mean_slo():
    assert parse_slo("tpot:50@mean") == SloFlag("tpot_ms", 50.0, None, "mean")
    assert parse_slo("e2el:2000@MEAN").statistic == "mean"
    assert parse_slo("tpot:50@p90") == SloFlag("tpot_ms", 50.0, 0.9)  # a quantile stays a quantile
    raw = ScenarioFlags(slos=[parse_slo("tpot:50@mean"), parse_slo("ttft:500")]).apply({"name": "x"})
    assert raw["tiers"]["standard"]["slo"] == {"tpot_ms": {"threshold": 50.0, "statistic": "mean"}, "ttft_ms": 500.0}
    scn = parse_scenario({**raw, "workload": {"input_len": 8, "output_len": 4}, "search": {"start": 2}})
    assert scn.tier_slos == {"standard": {"tpot_ms@mean": 50.0, "ttft_ms": 500.0}}
    slos = {s.metric: s for s in scn.slos()["standard"]}
    assert slos["tpot_ms"].statistic == "mean" and slos["tpot_ms"].label == "mean"
    assert slos["ttft_ms"].statistic == "quantile" and slos["ttft_ms"].label == "p99"
    assert slos["tpot_ms"].as_dict() == {"metric": "tpot_ms", "statistic": "mean", "quantile": None,
                                         "threshold_ms": 50.0}
    assert slos["ttft_ms"].as_dict() == {"metric": "ttft_ms", "quantile": 0.99, "threshold_ms": 500.0}
    yaml_form = parse_scenario({"name": "y", "workload": {"input_len": 8, "output_len": 4}, "load": {"requests": 4},
                                "tiers": {"premium": {"slo": {"tpot_ms": {"threshold": 40, "statistic": "mean"},
                                                              "ttft_ms": {"threshold": 300, "quantile": 0.9}}}}})
    assert yaml_form.tier_slos == {"premium": {"tpot_ms@mean": 40.0, "ttft_ms": 300.0}}
    assert yaml_form.slo_quantiles == {"premium": {"ttft_ms": 0.9}}


@pytest.mark.parametrize("slo,msg", [
    ({"tpot_ms": {"threshold": 50, "statistic": "median"}}, "statistic: expected one of quantile, mean"),
    ({"tpot_ms": {"threshold": 50, "statistic": "mean", "quantile": 0.9}}, "has no quantile"),
])
def test_bad_statistics_name_their_key(slo, msg):
    with pytest.raises(ScenarioError, match=msg):
        parse_scenario({"name": "x", "workload": {"input_len": 8, "output_len": 4}, "load": {"requests": 4},
                        "tiers": {"standard": {"slo": slo}}})


def test_a_bad_form_after_the_at_is_still_one_line():
    with pytest.raises(ScenarioError, match="expected a quantile p50 ... p99.9 \\(or mean\\)"):
        parse_slo("tpot:50@average")
    r = slobench("capacity", "--slo", "tpot:50@average", "--target", "http://127.0.0.1:9")
    assert r.returncode == 2 and "(or mean)" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


# ------------------------------------------------------------------ a step's judgement


def test_a_step_judges_the_mean_and_a_failed_request_breaks_it():
    values = np.array([30.0, 40.0, 45.0, 60.0])  # mean 43.75: passes though one request is over 50
    j = judge(values, MEAN_TPOT)
    assert j.passed is True and j.value_ms == pytest.approx(43.75) and j.over == 1
    assert j.ci_low_ms <= 43.75 <= j.ci_high_ms
    assert judge(np.array([60.0, 70.0]), MEAN_TPOT).passed is False
    broken = judge(np.array([10.0, 10.0, math.inf]), MEAN_TPOT)
    assert broken.passed is False and broken.value_ms is None and broken.failed == 1
    # in a step's tier entry: the mean, marked as one; a failed request makes it null and failing
    rs = [rec(i, 0.1 * i, 40.0) for i in range(20)]
    e = tier_entry(rs, [MEAN_TPOT], 0.99, 0.95, seed=0)
    j = e["judged"]["tpot_ms"]
    assert j["statistic"] == "mean" and j["quantile"] is None and j["passed"] is True
    assert j["value_ms_q"] == pytest.approx(40.0) and j["n"] == 20
    e = tier_entry([*rs, rec(99, 2.5, 0.0, status="error")], [MEAN_TPOT], 0.99, 0.95, seed=0)
    assert e["judged"]["tpot_ms"]["passed"] is False and e["judged"]["tpot_ms"]["value_ms_q"] is None
    # a quantile SLO's entry is as it was: no statistic key
    q = tier_entry(rs, [SLO("tpot_ms", 50.0, 0.9)], 0.99, 0.95, seed=0)["judged"]["tpot_ms"]
    assert "statistic" not in q and q["quantile"] == 0.9
    # goodput counts requests: the mean SLO is no request's to meet
    slow = [rec(i, 0.1 * i, 80.0) for i in range(10)]
    assert goodput_rps(slow, {"standard": [MEAN_TPOT]}, 1.0) == 10.0
    assert goodput_rps(slow, {"standard": [SLO("tpot_ms", 50.0)]}, 1.0) == 0.0


def test_a_certain_breach_of_a_mean_counts_what_is_to_come_as_zero():
    # 10 planned; the 3 known sum to 600 ms: the mean is at least 60 ms > 50 whatever the other 7 do
    assert breach_certain(np.array([200.0, 200.0, 200.0]), 10, MEAN_TPOT)
    # the same sum over 20 planned is at least 30 ms: the rest may still save it
    assert not breach_certain(np.array([200.0, 200.0, 200.0]), 20, MEAN_TPOT)
    assert breach_certain(np.array([1.0, math.inf]), 100, MEAN_TPOT)  # a failed request: certain


def mean_settings(tmp_path, slo: str = "{tpot_ms: {threshold: 50, statistic: mean}}") -> CapacitySettings:
    p = tmp_path / "s.yaml"
    p.write_text(f"name: t\nworkload: {{input_len: 8, output_len: 5}}\ntiers: {{standard: {{slo: {slo}}}}}\n"
                 "search: {start: 4, step_duration_s: 20, warmup_s: 2}\n")
    from loadgen.scenario.parse import load_scenario
    return CapacitySettings.from_scenario(load_scenario(p))


def test_the_looks_stop_a_step_at_a_certain_breach_of_its_mean(tmp_path):
    settings = mean_settings(tmp_path)
    assert min_samples(settings, "standard") == MEAN_MIN_SAMPLES
    w0, w1 = 2.0, 20.0
    slow = [rec(i, w0 + 0.1 * i, 400.0) for i in range(40)]  # each ~400 ms a token: the mean is far over
    looks = StepLooks(settings, w0, w1, Counter(standard=100), "bisect")
    d = None
    for t in np.arange(w0 + 0.5, w0 + 10, 0.5):
        d = looks.look([r for r in slow if r.scheduled_s < t], t)
        if d:
            break
    assert d is not None and (d.kind, d.by) == ("breach", "certain")
    assert d.reason.startswith("standard mean TPOT over 50 ms whatever follows")
    # a fast window is never passed by confidence (no sequential test of a mean): the cap or a clear pass
    jitter = np.random.default_rng(3).uniform(2.0, 8.0, 300)  # independent: the effective count is the count
    fast = [rec(i, w0 + 0.05 * i, jitter[i]) for i in range(300)]
    looks = StepLooks(settings, w0, w1, Counter(standard=360), "bisect")
    assert all(looks.look([r for r in fast if r.scheduled_s < t], t) is None for t in np.arange(w0 + 0.5, w1, 0.5))
    reason = clear_pass_reason(settings, fast, w0, 17.0)
    assert reason and "quantile or mean" in reason


# ------------------------------------------------------------------ the rating


def step(i: int, load: float, judged: dict) -> dict:
    return {"index": i, "load": load, "planned_rps": load, "phase": "ramp", "passed": True,
            "tiers": {"standard": {"quantile": 0.99, "judged": judged}}}


def mean_entry(load: float, knee: float = 10.0, n: int = 200) -> dict:
    """The mean TPOT of a window at ``load``: 50 ms x (load / knee)^2, so it crosses 50 ms at the knee."""
    m = 50.0 * (load / knee) ** 2
    return {"value_ms_q": m, "threshold_ms": 50.0, "quantile": None, "statistic": "mean", "n": n, "over": 0,
            "runs": 0, "passed": m <= 50.0}


def share_entry(load: float, knee: float, n: int = 2000) -> dict:
    """A p99 TTFT window whose share over the threshold is 1 % x (load / knee)^8."""
    share = min(0.01 * (load / knee) ** 8, 1.0)
    return {"value_ms_q": 300.0 * (load / knee), "threshold_ms": 300.0, "quantile": 0.99, "n": n,
            "over": round(share * n), "runs": max(1, round(share * n)), "passed": share <= 0.01}


LOADS = [4.0, 6.0, 8.0, 9.0, 11.0, 12.0, 16.0]


def test_the_rating_is_where_the_mean_crosses_its_threshold():
    steps = [step(i, x, {"tpot_ms": mean_entry(x)}) for i, x in enumerate(LOADS)]
    r = rate(steps, n_boot=200)
    # log margin is linear in log load: interpolating between 9 and 11 finds the knee exactly
    assert r["estimate"] == pytest.approx(10.0) and r["open"] is None
    assert r["binding"] == {"tier": "standard", "metric": "tpot_ms"}
    assert r["crossings"] == [{"tier": "standard", "metric": "tpot_ms", "load": pytest.approx(10.0), "open": None,
                               "fit": "isotonic", "statistic": "mean"}]
    assert r["interval_method"] == "bootstrap" and r["ci_low"] <= 10.0 <= r["ci_high"]
    assert r["ci_low"] >= 9.0 and r["ci_high"] <= 11.0  # the neighbouring windows bound it
    assert "mean SLOs" in r["method"] and r["windows"] == len(LOADS)
    # with a quantile SLO that breaks higher up, the mean binds; with one that breaks lower, the quantile does
    both = [step(i, x, {"tpot_ms": mean_entry(x), "ttft_ms": share_entry(x, 13.0)}) for i, x in enumerate(LOADS)]
    r = rate(both, n_boot=200)
    assert r["binding"]["metric"] == "tpot_ms" and r["estimate"] == pytest.approx(10.0)
    low = [step(i, x, {"tpot_ms": mean_entry(x, knee=14.0), "ttft_ms": share_entry(x, 10.0)})
           for i, x in enumerate(LOADS)]
    alone = [step(i, x, {"ttft_ms": share_entry(x, 10.0)}) for i, x in enumerate(LOADS)]
    r, q = rate(low, n_boot=200), rate(alone, n_boot=200)
    assert r["binding"]["metric"] == "ttft_ms" and r["estimate"] == pytest.approx(q["estimate"])
    # a mean that never reaches its threshold leaves the rating open above
    flat = [step(i, x, {"tpot_ms": mean_entry(x, knee=100.0)}) for i, x in enumerate(LOADS)]
    assert rate(flat, n_boot=50)["open"] == "above"


# ------------------------------------------------------------------ run / replay summaries


def test_a_run_summary_judges_a_mean_slo_apart_from_goodput():
    rs = [rec(i, 0.1 * i, 40.0 if i % 2 else 70.0) for i in range(10)]  # mean 55 ms: half the requests over 50
    dicts = [json.loads(r.to_json()) for r in rs]
    slos = {"standard": {"tpot_ms@mean": 50.0, "ttft_ms": 500.0}}
    s = summarize(dicts, goodput={"tpot_ms@mean": 50.0, "ttft_ms": 500.0}, tier_slos=slos)
    assert s["goodput_slo"] == {"ttft_ms": 500.0} and s["goodput_fraction"] == 1.0  # every request met 500 ms
    t = s["tiers"]["standard"]
    assert t["slo_met"] == 10 and t["slo"] == slos["standard"]
    assert t["slo_means"]["tpot_ms"]["mean_ms"] == pytest.approx(55.0) and t["slo_means"]["tpot_ms"]["passed"] is False
    failed = summarize([*dicts[1::2], json.loads(rec(99, 2.0, 0.0, status="error").to_json())],
                       tier_slos={"standard": {"tpot_ms@mean": 50.0}})["tiers"]["standard"]
    assert "slo_attainment" not in failed  # no per-request SLO to attain
    assert failed["slo_means"]["tpot_ms"] == {"threshold_ms": 50.0, "mean_ms": None, "n": 6, "failed": 1,
                                              "passed": False}
    assert per_request_slos(slos["standard"]) == {"ttft_ms": 500.0}
    assert mean_slos(slos["standard"]) == {"tpot_ms": 50.0}


# ------------------------------------------------------------------ end to end


FAST = ["--set", "search.step_duration_s=3", "--set", "search.warmup_s=1", "--set", "search.start=8",
        "--set", "search.max_steps=4", "--set", "search.max_duration_s=45", "--set", "client.lateness_bound_ms=200",
        "--no-progress", "--no-report"]


def test_capacity_and_run_with_mean_slos_against_the_mock_server(mock_server, tmp_path):
    """Two slots of ~50 ms each (about 40 req/s): the mean TTFT breaks as the queue grows, the mean TPOT (10 ms
    a token whatever the load) never does; the search rates the load where the mean TTFT crosses 150 ms."""
    url = mock_server("--slots", 2, "--ttft-ms", 20, "--itl-ms", 10)
    out = tmp_path / "cap"
    r = slobench("capacity", "--target", url + "/v1", "--slo", "tpot:50@mean", "--slo", "ttft:150@mean",
                 "--input-len", 16, "--output-len", 4, "--out", out, *FAST, timeout=300)
    assert r.returncode == 0, r.stderr
    s = json.loads((out / "summary.json").read_text())
    mean = {"statistic": "mean", "quantile": None}
    assert s["slos"]["standard"] == [{"metric": "tpot_ms", **mean, "threshold_ms": 50.0},
                                     {"metric": "ttft_ms", **mean, "threshold_ms": 150.0}]
    judged = [st["tiers"]["standard"]["judged"] for st in s["steps"] if st["tiers"]["standard"]["judged"]]
    assert judged and all(j["tpot_ms"]["statistic"] == "mean" and j["tpot_ms"]["passed"] for j in judged)
    assert s["verdict"] == "rated", s["verdict_text"]
    rc = s["rated_capacity"]
    assert rc["binding"] == {"tier": "standard", "metric": "ttft_ms"}
    assert rc["ci_low"] <= rc["estimate"] <= rc["ci_high"]
    assert {c["statistic"] for c in rc["interval"]["crossings"]} == {"mean"}
    rows = list(csv.DictReader(io.StringIO((out / "steps.csv").read_text())))
    assert rows and {row["standard.tpot_ms.quantile"] for row in rows} == {"mean"}
    # `run` prints the mean's verdict apart; goodput leaves it out
    run_out = tmp_path / "run"
    r = slobench("run", "--target", url + "/v1", "--slo", "tpot:50@mean", "--slo", "ttft:2000", "--requests", 20,
                 "--rate", 10, "--input-len", 8, "--output-len", 4, "--out", run_out, timeout=120)
    assert r.returncode == 0, r.stderr
    rs = json.loads(next(run_out.rglob("summary.json")).read_text())
    assert rs["goodput_slo"] == {"ttft_ms": 2000.0}
    verdict = rs["tiers"]["standard"]["slo_means"]["tpot_ms"]
    assert verdict["passed"] is True and verdict["mean_ms"] == pytest.approx(10.0, rel=0.5)
    assert "mean TPOT" in r.stdout and "PASS" in r.stdout
