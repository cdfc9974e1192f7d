"""Scenario files: every mistake gets one readable line naming the key path, what was expected and what
was found; the shipped scenarios all load and build; the engine option table matches the engine."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from loadgen.capacity.settings import CapacitySettings
from loadgen.scenario.engine_options import ENGINE_OPTIONS
from loadgen.scenario.flags import apply_override
from loadgen.scenario.model import ScenarioError
from loadgen.scenario.parse import load_scenario, parse_scenario
from loadgen.scenario.steps import step_specs

REPO = Path(__file__).resolve().parents[3]
SCENARIOS = sorted((REPO / "loadgen" / "scenarios").glob("*.yaml"))

GOOD = """
name: t
engine: {model: tiny, max_num_seqs: 16}
workload: {input_len: 32, output_len: 8}
tiers:
  premium: {weight: 1, slo: {ttft_ms: 300}}
  standard: {weight: 2, slo: {ttft_ms: 800, quantile: 0.95}}
  basic: {weight: 1}
search: {axis: rate, start: 2, growth: 2, step_duration_s: 10, warmup_s: 2}
headroom: 0.2
"""


def good() -> dict:
    return yaml.safe_load(GOOD)


def with_(path: str, value) -> dict:
    raw = good()
    node = raw
    *parents, last = path.split(".")
    for k in parents:
        node = node.setdefault(k, {})
    node[last] = value
    return raw


def without(path: str) -> dict:
    raw = good()
    node = raw
    *parents, last = path.split(".")
    for k in parents:
        node = node[k]
    del node[last]
    return raw


# (scenario, the key path the message must start with, words it must contain)
MISTAKES = [
    # 1 a wrong type
    (with_("search.start", "fast"), "search.start", ["expected a number", "found str 'fast'"]),
    # 2 a boolean where a count goes
    (with_("search.max_steps", True), "search.max_steps", ["expected an integer", "found bool True"]),
    # 3 a misspelt key
    (with_("search.step_duration", 10), "search.step_duration", ["unknown key", "known:", "step_duration_s"]),
    # 4 a value outside its choices
    (with_("search.axis", "tokens"), "search.axis", ["expected one of rate, concurrency", "found 'tokens'"]),
    (with_("search.arrivals", "sometimes"), "search.arrivals", ["expected one of fresh, common", "found 'sometimes'"]),
    (with_("search.window_counts", "fixed"), "search.window_counts", ["expected one of drawn, exact", "found 'fixed'"]),
    (with_("search.refine_steps", -2), "search.refine_steps", ["expected a value >= 0", "found -2"]),
    # 5 a growth factor that never grows
    (with_("search.growth", 1), "search.growth", ["expected a factor > 1", "found 1.0"]),
    # 6 a warm-up as long as the step
    (with_("search.warmup_s", 10), "search.warmup_s", ["expected less than step_duration_s (10)", "found 10"]),
    # 7 a quantile written as a percentage
    (with_("tiers.premium.slo.quantile", 99), "tiers.premium.slo.quantile", ["between 0 and 1", "found 99.0"]),
    # 8 an unknown SLO metric
    (with_("tiers.premium.slo.ttfb_ms", 300), "tiers.premium.slo.ttfb_ms", ["unknown SLO", "ttft_ms"]),
    # 9 a negative threshold
    (with_("tiers.standard.slo.ttft_ms", -5), "tiers.standard.slo.ttft_ms", ["expected a value > 0", "found -5"]),
    # 10 an unknown service tier
    (with_("tiers.gold", {"weight": 1}), "tiers.gold", ["unknown service tier", "premium, standard, basic"]),
    # 11 headroom as a percentage
    (with_("headroom", 20), "headroom", ["expected a fraction in [0, 1)", "found 20.0"]),
    # 12 an engine option that does not exist
    (with_("engine.max_seqs", 8), "engine.max_seqs", ["unknown engine option", "max_num_seqs"]),
    # 13 an engine option of the wrong type
    (with_("engine.max_num_seqs", "lots"), "engine.max_num_seqs", ["expected an integer", "found str 'lots'"]),
    # 14 an engine option outside its choices
    (with_("engine.batching", "dynamic"), "engine.batching", ["expected one of continuous, static",
                                                               "found 'dynamic'"]),
    # 15 a port for the embedded engine
    (with_("engine.port", 8000), "engine.port", ["free loopback port", "target:"]),
    # 16 a target that is not a URL
    (with_("target", "localhost:8000"), "target", ["expected an http(s) URL", "found 'localhost:8000'"]),
    # 17 no workload at all
    (without("workload"), "workload", ["required", "expected a mapping"]),
    # 18 a trace that is not there
    (with_("workload", {"type": "trace", "path": "no/such/trace.jsonl"}), "workload.path",
     ["expected a trace file", "found no file"]),
    # 19 an open-loop axis with closed-loop arrivals
    (with_("load", {"arrival": "closed", "concurrency": 4}), "search.axis", ["needs open-loop arrivals",
                                                                              "found load.arrival: closed"]),
    # 20 a capacity search with nothing to judge
    (with_("tiers", {"basic": {"weight": 1}}), "tiers", ["needs at least one tier with an SLO"]),
    # 21 a mapping where a list goes
    (with_("workload.token_range", {"lo": 1}), "workload.token_range", ["expected a list", "found dict"]),
    # 22 the whole file a list
    (["name", "chat"], "scenario", ["expected a mapping", "found list"]),
    # 23 a length of zero
    (with_("workload.input_len", 0), "workload.input_len", ["expected a length >= 1", "found 0"]),
    # 24 a confidence of 95 (percent)
    (with_("search.confidence", 95), "search.confidence", ["expected a fraction in (0, 1)", "found 95.0"]),
]


@pytest.mark.parametrize("raw,path,words", MISTAKES, ids=[f"{i + 1}-{m[1]}" for i, m in enumerate(MISTAKES)])
def test_mistakes_name_the_key_the_expectation_and_the_value(raw, path, words):
    with pytest.raises(ScenarioError) as e:
        parse_scenario(raw, base=REPO)
    msg = str(e.value)
    assert msg.startswith(path + ":") or msg.startswith(path + " "), msg
    assert "\n" not in msg
    for w in words:
        assert w in msg, (w, msg)


def test_the_good_scenario_parses():
    s = parse_scenario(good(), base=REPO)
    assert s.search.axis == "rate" and s.step.window_s == 8 and s.headroom == 0.2
    slos = s.slos()
    assert slos["basic"] == [] and slos["premium"][0].quantile == 0.99 and slos["standard"][0].quantile == 0.95
    settings = CapacitySettings.from_scenario(s)
    assert settings.drain_s == 2.0  # 2 x the largest threshold (0.8 s), at least 2 s


def test_overrides_are_validated_like_the_file(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text(GOOD)
    assert load_scenario(p, ["search.start=8", "engine.max_num_seqs=4"]).search.start == 8
    with pytest.raises(ScenarioError, match=r"search\.start: expected a number, found str 'x'"):
        load_scenario(p, ["search.start=x"])
    with pytest.raises(ScenarioError, match="expected KEY=VALUE"):
        load_scenario(p, ["search.start"])
    with pytest.raises(ScenarioError, match="name is not a mapping"):
        apply_override({"name": "x"}, "name.first=1")


def test_yaml_errors_are_one_line(tmp_path):
    p = tmp_path / "broken.yaml"
    p.write_text("name: [unclosed\nsearch: {")
    with pytest.raises(ScenarioError) as e:
        load_scenario(p)
    assert "not valid YAML" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ScenarioError, match="scenario file not found"):
        load_scenario(tmp_path / "nope.yaml")


def _slobench(*args):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "loadgen.cli", *map(str, args)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("edit,words", [
    ("search: {axis: rate, start: 2, growth: 0.5}", "search.growth: expected a factor > 1, found 0.5"),
    ("tiers: {gold: {slo: {ttft_ms: 300}}}", "tiers.gold: unknown service tier"),
    ("engine: {model: tiny, max_num_seqs: many}", "engine.max_num_seqs: expected an integer, found str 'many'"),
])
def test_capacity_cli_bad_scenario_is_one_line_exit_2(tmp_path, edit, words):
    raw = good()
    raw.update(yaml.safe_load(edit))
    p = tmp_path / "bad.yaml"
    p.write_text(yaml.safe_dump(raw))
    r = _slobench("capacity", p, "--out", tmp_path / "run")
    assert r.returncode == 2, r.stderr
    assert words in r.stderr and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()  # nothing started


def test_capacity_cli_bad_set_and_target(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text(GOOD)
    r = _slobench("capacity", p, "--set", "search.tolerance=0")
    assert r.returncode == 2 and "search.tolerance: expected a value > 0, found 0.0" in r.stderr
    r = _slobench("capacity", p, "--target", "127.0.0.1:8000")
    assert r.returncode == 2 and "--target must be an http(s) URL" in r.stderr
    assert all(len(x.stderr.strip().splitlines()) == 1 for x in [r])


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_shipped_scenarios_load_and_build(path):
    s = load_scenario(path)
    specs, info = s.build()  # what `slobench run` would send
    assert specs and all(sp.max_tokens >= 1 for sp in specs)
    if s.search is None:
        return
    settings = CapacitySettings.from_scenario(s)
    assert settings.step.step_duration_s <= 30 and settings.search.max_steps <= 14  # a few minutes on 2 cores
    for load in (settings.search.start, settings.search.start * settings.search.growth ** 3):
        step = step_specs(s, settings.search.axis, load, 1, 100.0, settings.step.step_duration_s)
        assert step and all(sp.id.startswith("s1-") for sp in step)
        if settings.search.axis == "rate":
            assert all(100.0 <= sp.arrival_s < 100.0 + settings.step.step_duration_s for sp in step)
        n_in = [sp.prompt_tokens for sp in step if sp.prompt_tokens]
        assert max(n_in) + max(sp.max_tokens for sp in step) <= 8192  # the tiny model's context


def test_engine_option_table_matches_the_engine():
    import argparse
    import dataclasses

    pytest.importorskip("torch")
    from engine.request.config import EngineConfig
    from engine.server.server_args import add_server_arguments

    fields = {f.name for f in dataclasses.fields(EngineConfig)}
    p = add_server_arguments(argparse.ArgumentParser())
    flags = {a.dest for a in p._actions if a.dest != "help"}
    assert fields <= set(ENGINE_OPTIONS), fields - set(ENGINE_OPTIONS)
    own = {"host", "port", "parent_pid"}  # the flags slobench sets itself when it starts the engine
    assert set(ENGINE_OPTIONS) == flags - own, set(ENGINE_OPTIONS) ^ (flags - own)


def test_embedded_engine_keeps_the_scenarios_ttft_promises():
    """The engine's admission refuses by its own promises; started for a scenario it takes the tiers'
    TTFT SLOs (long-prompt-burst: 600 / 1500 ms, not the engine's 300 / 800), unless the engine section or
    --engine-opt sets them; the flags reach the server's config, unnamed tiers keeping its defaults."""
    import argparse

    pytest.importorskip("torch")
    from engine.server.server_args import add_server_arguments, config_from_args
    from loadgen.commands.plan import engine_shape
    from loadgen.target.embedded import engine_args

    burst = load_scenario(REPO / "loadgen" / "scenarios" / "long-prompt-burst.yaml")
    opts = burst.engine_options()
    assert opts["tier_ttft_slo_ms"] == {"premium": 600.0, "standard": 1500.0}
    assert opts["prefill_chunk_size"] == 256  # the engine section is kept
    cfg = config_from_args(add_server_arguments(argparse.ArgumentParser()).parse_args(engine_args(opts)))
    assert cfg.tier_ttft_slo_ms == {"premium": 600.0, "standard": 1500.0}
    assert engine_shape(opts, None).tier_ttft_slo_ms == {"premium": 600.0, "standard": 1500.0}

    own = {"premium": 200.0}
    assert burst.engine_options([("tier_ttft_slo_ms", own)])["tier_ttft_slo_ms"] == own
    assert engine_shape({"tier_ttft_slo_ms": own}, None).tier_ttft_slo_ms == {"premium": 200.0, "standard": 800.0}
    s = parse_scenario(yaml.safe_load(GOOD.replace("max_num_seqs: 16", "tier_ttft_slo_ms: {premium: 100}")))
    assert s.engine_options()["tier_ttft_slo_ms"] == {"premium": 100}
    no_ttft = parse_scenario(yaml.safe_load(GOOD.replace("ttft_ms", "e2el_ms")))
    assert "tier_ttft_slo_ms" not in no_ttft.engine_options()


def test_spread_ties_and_trace_scaling():
    from loadgen.workload.shaping import scale_specs, spread_ties
    from loadgen.workload.specs import BlockPrompt, RequestSpec

    specs = [RequestSpec(f"r{i}", t, BlockPrompt((0, 1, i + 2), 1200, 512), 400, prompt_tokens=1200)
             for i, t in enumerate([0.0, 0.0, 0.0, 0.0, 3.0, 6.0, 6.0])]
    spread_ties(specs, 3.0)
    assert [s.arrival_s for s in specs] == [0.0, 0.75, 1.5, 2.25, 3.0, 6.0, 7.5]
    scale_specs(specs, input_scale=1 / 32, output_scale=1 / 8, max_output_len=40)
    p = specs[0].prompt
    assert p.block_size == 16 and p.num_tokens == 38 and specs[0].prompt_tokens == 38  # ceil(1200 / 32)
    assert specs[0].max_tokens == 40 and specs[1].prompt.tokens()[:32] == p.tokens()[:32]  # shared hash ids
    assert specs[1].prompt.tokens()[32:] != p.tokens()[32:]
