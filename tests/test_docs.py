"""The manual against the code: docs/scenarios.md lists every key the scenario parser accepts with the default
the parser gives it; every ``slobench`` command shown in README.md and docs/*.md parses; README.md stays a
short manual; no commit hash or date in the prose (git keeps the history)."""

from __future__ import annotations

import argparse
import dataclasses
import re
import shlex
from pathlib import Path

import pytest
import yaml

from engine.request.tiers import TIER_NAMES
from loadgen.cli import build_parser
from loadgen.scenario import parse as parse_module
from loadgen.scenario.engine_options import ENGINE_OPTIONS
from loadgen.scenario.model import SLO_NAMES
from loadgen.scenario.parse import parse_scenario
from loadgen.scenario.schema import MISSING, MappingNode

REPO = Path(__file__).resolve().parent.parent
DOCS = sorted((REPO / "docs").glob("*.md"))
MANUAL = [REPO / "README.md", *DOCS]
SLO = {"standard": {"slo": {"ttft_ms": 500}}}


# --- what the parser accepts, recorded while it parses --------------------------------------------------------

def _generic(path: str) -> str:
    """A recorded key path with its free parts named: ``tiers.premium.slo.ttft_ms`` -> ``tiers.<tier>.slo.<metric>``,
    ``workload.output_len.min`` -> ``workload.<length>.min``."""
    parts = path.split(".")
    if parts[0] == "tiers" and len(parts) > 1:
        parts[1] = "<tier>" if parts[1] in TIER_NAMES else parts[1]
    parts = ["<metric>" if i > 0 and p in SLO_NAMES and parts[i - 1] in ("slo", "goodput") else p
             for i, p in enumerate(parts)]
    if parts[:2] in (["workload", "input_len"], ["workload", "output_len"]) and len(parts) > 2:
        parts[1] = "<length>"
    return ".".join(parts)


def record(monkeypatch, raws: list[dict], base: Path) -> dict[str, object]:
    """Parse ``raws`` with every mapping recording the keys asked of it: {generic key path: the default the
    parser used where the key was absent, else MISSING}."""
    seen: dict[str, object] = {}
    get, child, parse_length = MappingNode.get, MappingNode.child, parse_module._parse_length

    def note(node: MappingNode, k: str, default) -> None:
        key = _generic(node.key(str(k)))
        if k not in node.data and default is not MISSING:
            seen[key] = default
        else:
            seen.setdefault(key, MISSING)

    def rec_get(self, k, types, default=MISSING, **kw):
        note(self, k, default)
        return get(self, k, types, default, **kw)

    def rec_child(self, k, default=MISSING):
        seen.setdefault(_generic(self.key(str(k))), MISSING)
        return child(self, k, default)

    def rec_length(node, k, default, b):
        note(node, k, default)
        return parse_length(node, k, default, b)

    monkeypatch.setattr(MappingNode, "get", rec_get)
    monkeypatch.setattr(MappingNode, "child", rec_child)
    monkeypatch.setattr(parse_module, "_parse_length", rec_length)
    for raw in raws:
        parse_scenario(raw, base=base)
    monkeypatch.undo()
    return seen


def _trace(tmp: Path) -> Path:
    p = tmp / "t.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"2023-11-16 18:00:{i:02d}.000000,{10 + i},{3 + i}\n" for i in range(20)))
    return p


def complete_scenarios(tmp: Path) -> list[dict]:
    """Scenarios that together use every section and every branch of the parser."""
    trace = _trace(tmp)
    tiers = {"premium": {"weight": 1, "slo": {"ttft_ms": 300, "quantile": 0.99, "max_shed": 0.01}},
             "standard": {"weight": 2, "slo": {"ttft_ms": 800, "tpot_ms": {"threshold": 50, "quantile": 0.9}}}}
    lengths = [{"dist": "fixed", "value": 8}, {"dist": "uniform", "min": 4, "max": 16},
               {"dist": "normal", "mean": 10, "std": 2}, {"dist": "lognormal", "mean": 10, "sigma": 0.5},
               {"dist": "empirical", "values": [4, 8]}, {"dist": "empirical", "from": str(trace), "column": "output"}]
    synthetic = [{
        "name": "all", "seed": 1, "target": None, "model": None, "headroom": 0.2,
        "workload": {"type": "synthetic", "input_len": d, "output_len": 8, "token_range": [10, 250],
                     "ignore_eos": True, "shared_prefix": {"num_prompts": 2, "length": 16, "ratio": 0.5},
                     "conversations": {"turns": 2, "think_time_s": 1.0, "answer_tokens": 8, "history": "real"},
                     "cancel": {"ratio": 0.1, "after_tokens": 4}},
        "tiers": tiers, "load": {"arrival": "poisson", "rate": 2, "burstiness": 1, "concurrency": 0,
                                 "requests": 10, "duration_s": 5},
        "goodput": {"ttft_ms": 800},
        "client": {"max_connections": 0, "read_timeout_s": 300, "workers": 1, "lateness_bound_ms": 10,
                   "send_tier": None, "endpoint": None, "continuous_usage": None},
        "search": {"quantile": 0.99},
    } for d in lengths]
    trace_scn = {"workload": {"type": "trace", "path": str(trace), "format": "azure"}, "tiers": SLO,
                 "load": {"arrival": "trace", "rate": 2}, "search": {}}
    closed = {"workload": {}, "tiers": SLO, "load": {"arrival": "closed"}, "search": {"axis": "concurrency"}}
    cancel_s = {"workload": {"cancel": {"ratio": 0.1, "after_s": 1.0}}, "tiers": SLO, "load": {"requests": 4}}
    return [*synthetic, trace_scn, closed, cancel_s]


def documented(path: Path) -> list[tuple[str, str, str]]:
    """The rows of a doc's key tables: (key, its default cell, the section it is under). A row is
    ``| `key` | default | meaning |`` under a table header whose first column is ``key``."""
    rows, section, in_table = [], "", False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            section = line.lstrip("#").strip()
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
        if not cells:
            in_table = False
        elif cells[0] == "key":
            in_table = True
        elif in_table and re.fullmatch(r"`[^`]+`", cells[0]):
            rows.append((cells[0].strip("`"), cells[1], section))
    return rows


def stated_default(cell: str) -> object:
    """A default cell that is one backticked YAML value, parsed; MISSING for prose (a derived default)."""
    m = re.fullmatch(r"`([^`]*)`", cell)
    return yaml.safe_load(m.group(1)) if m else MISSING


def test_scenarios_md_lists_every_key_the_parser_accepts(monkeypatch, tmp_path):
    accepted = set(record(monkeypatch, complete_scenarios(tmp_path), tmp_path))
    accepted -= {"engine"}  # its keys are the engine options, checked below
    listed = {k for k, _, _ in documented(REPO / "docs" / "scenarios.md") if not k.startswith("engine.")}
    sections = {k for k in accepted if any(a.startswith(k + ".") for a in accepted)}
    assert accepted - sections - listed == set(), "docs/scenarios.md leaves out keys the parser accepts"
    assert listed - accepted == set(), "docs/scenarios.md lists keys the parser does not accept"


def test_scenarios_md_lists_every_engine_option():
    listed = {k.removeprefix("engine.") for k, _, _ in documented(REPO / "docs" / "scenarios.md")
              if k.startswith("engine.")}
    assert listed == set(ENGINE_OPTIONS)


def _minimal_defaults(monkeypatch, tmp: Path) -> tuple[dict, dict]:
    synthetic = record(monkeypatch, [{"workload": {"shared_prefix": {}, "conversations": {}}, "tiers": SLO,
                                      "search": {}, "client": {}}], tmp)
    trace = record(monkeypatch, [{"workload": {"type": "trace", "path": str(_trace(tmp))}, "tiers": SLO,
                                  "search": {}}], tmp)
    return synthetic, trace


DERIVED = {"name"}  # its default is the scenario file's name (load_scenario passes it; parse_scenario has none)


def test_the_defaults_scenarios_md_states_are_the_parsers(monkeypatch, tmp_path):
    synthetic, trace = _minimal_defaults(monkeypatch, tmp_path)
    rows = documented(REPO / "docs" / "scenarios.md")
    checked = 0
    for key, cell, section in rows:
        code = (trace if "trace" in section.lower() else synthetic).get(key, MISSING)
        if key.startswith("engine.") or code is MISSING or key in DERIVED:
            continue
        assert stated_default(cell) == code, f"docs/scenarios.md: {key}: states {cell}, the parser's is {code!r}"
        checked += 1
    assert checked >= 40


def test_the_engine_option_defaults_scenarios_md_states_are_the_engines():
    from engine.request.config import EngineConfig
    from engine.server.server_args import add_server_arguments

    config = {f.name: f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
              for f in dataclasses.fields(EngineConfig)}
    server = add_server_arguments(argparse.ArgumentParser())
    engine_rows = [(k, cell) for k, cell, _ in documented(REPO / "docs" / "scenarios.md") if k.startswith("engine.")]
    assert len(engine_rows) >= 20, engine_rows
    for key, cell in engine_rows:
        name = key.removeprefix("engine.")
        code = config[name] if name in config else server.get_default(name)
        assert stated_default(cell) == code, f"docs/scenarios.md: {key}: states {cell}, the engine's is {code!r}"


# --- every command shown parses ---------------------------------------------------------------------------------

def shown_commands(path: Path) -> list[str]:
    """The ``slobench ...`` lines of a document's fenced code blocks, continuation lines joined."""
    out, fenced, pending = [], False, ""
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced, pending = not fenced, ""
            continue
        if not fenced:
            continue
        text = pending + line.strip()
        if text.endswith("\\"):
            pending = text[:-1] + " "
            continue
        pending = ""
        text = re.sub(r"^\$ ", "", text)
        if text.startswith("slobench "):
            out.append(text)
    return out


def _args(command: str) -> list[str]:
    """A shown command's arguments: comments dropped, ``<placeholders>`` made values."""
    words = shlex.split(command, comments=True)[1:]
    return [re.sub(r"<[^>]+>", "x", w) for w in words]


COMMANDS = [(p.relative_to(REPO).as_posix(), c) for p in MANUAL for c in shown_commands(p)]


def test_the_manual_shows_commands():
    assert len(COMMANDS) >= 20
    assert any(f == "README.md" for f, _ in COMMANDS)


@pytest.mark.parametrize(("doc", "command"), COMMANDS, ids=[f"{d}:{c[:60]}" for d, c in COMMANDS])
def test_every_command_shown_parses(doc, command):
    args = _args(command)
    parser = build_parser()
    if args[0] == "serve":
        choices = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
        assert "serve" in choices
        return
    try:
        parser.parse_args(args)
    except SystemExit as e:
        pytest.fail(f"{doc}: `{command}` does not parse (exit {e.code})")


# --- a manual, not a notebook -----------------------------------------------------------------------------------

def test_the_readme_is_at_most_400_lines():
    assert len((REPO / "README.md").read_text(encoding="utf-8").splitlines()) <= 400


HASH = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b")
DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")


@pytest.mark.parametrize("doc", MANUAL, ids=lambda p: p.name)
def test_no_commit_hash_or_date_in_the_manual(doc):
    lines = doc.read_text(encoding="utf-8").splitlines()
    bad = [f"{doc.name}:{i}: {line.strip()[:100]}" for i, line in enumerate(lines, 1)
           if HASH.search(line) or DATE.search(line)]
    assert not bad, "\n".join(bad)
