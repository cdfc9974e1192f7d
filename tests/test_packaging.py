"""The client installs and runs alone: without torch (and triton, transformers) the load generator runs `run`
and `capacity` against a mock, the engine's commands end in one line with exit 2; the built-in scenarios ship
in the wheel, resolve by name, list and parse; the wheel's requirements leave torch to the `engine` extra."""

from __future__ import annotations

import email
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from loadgen.scenario.builtin import (
    BUILTIN_DIR,
    builtin_names,
    builtin_scenarios,
    embedded_engine_note,
    resolve_scenario,
)
from loadgen.scenario.model import ScenarioError
from loadgen.scenario.parse import load_scenario
from tests.helpers import ENV, REPO

# Run the CLI in a fresh interpreter where torch, triton and transformers cannot be imported.
WITHOUT_TORCH = """
import sys
for name in ("torch", "triton", "transformers"):
    sys.modules[name] = None
from loadgen.cli import main
code = main(sys.argv[1:])
assert sys.modules["torch"] is None
sys.exit(code)
"""

TINY = """
name: tiny-client
seed: 0
workload: {type: synthetic, input_len: 32, output_len: 8}
tiers:
  standard: {weight: 1, slo: {ttft_ms: 500}}
load: {arrival: poisson, rate: 10, requests: 30}
search: {axis: rate, start: 4, growth: 2, tolerance: 0.2, step_duration_s: 2, warmup_s: 0.5, max_steps: 3,
         max_duration_s: 20, min_samples: 0}
client: {lateness_bound_ms: 50}
"""


def without_torch(*args, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", WITHOUT_TORCH, *map(str, args)], cwd=REPO, env=ENV,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_run_and_capacity_against_the_mock_without_torch(tmp_path, mock_server):
    url = mock_server("--ttft-ms", 5, "--itl-ms", 1)
    scenario = tmp_path / "tiny.yaml"
    scenario.write_text(TINY, encoding="utf-8")

    r = without_torch("run", scenario, "--target", url, "--out", tmp_path / "run", "--no-progress", "--no-report")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "run" / "summary.json").is_file()

    r = without_torch("capacity", scenario, "--target", url, "--out", tmp_path / "cap", "--no-progress",
                      "--no-report", "--json")
    assert r.returncode == 0, r.stderr
    assert '"kind": "capacity"' in r.stdout
    assert (tmp_path / "cap" / "summary.json").is_file()


@pytest.mark.parametrize("args", [
    ("run", "smoke"),  # no --target: the embedded engine
    ("capacity", "chat"),
    ("serve", "--model", "tiny"),
    ("generate", "hello"),
    ("experiments", "--list"),
])
def test_the_engine_without_torch_is_one_line_and_exit_2(tmp_path, args):
    r = without_torch(*args, "--out", tmp_path / "out") if args[0] in ("run", "capacity") else without_torch(*args)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == "error: the reference engine needs the engine extra: pip install 'slobench[engine]'"
    assert not (tmp_path / "out" / "engine.log").exists()  # nothing was started


def test_plan_sizes_a_preset_without_torch_and_host_says_it_needs_the_engine(tmp_path):
    r = without_torch("plan", "chat", "--hardware", "H100", "--requests", 300, "--draws", 1,
                      "--json", tmp_path / "plan.json")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "plan.json").is_file()
    r = without_torch("plan", "chat", "--hardware", "host")
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1 and "pip install 'slobench[engine]'" in r.stderr


def test_resolve_scenario_by_name_by_path_and_unknown(tmp_path, monkeypatch):
    assert resolve_scenario("chat") == BUILTIN_DIR / "chat.yaml"
    assert resolve_scenario("chat.yaml") == BUILTIN_DIR / "chat.yaml"
    own = tmp_path / "chat.yaml"  # an existing file wins over the built-in of the same name
    own.write_text(TINY, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    assert resolve_scenario("chat.yaml") == Path("chat.yaml")
    assert resolve_scenario(str(own)) == own
    with pytest.raises(ScenarioError) as e:
        resolve_scenario("no-such-scenario")
    assert "no-such-scenario" in str(e.value)
    for name in builtin_names():
        assert name in str(e.value)
    with pytest.raises(ScenarioError):
        resolve_scenario("../scenarios/chat")  # a name is a bare name, never a path into the package


def test_slobench_scenarios_lists_every_builtin_and_prints_one(capsys):
    from loadgen.cli import main

    assert main(["scenarios"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == builtin_names()
    by_name = {line.split()[0]: line for line in lines}
    assert "embedded engine" in by_name["chat"] and "any server" in by_name["your-server"]
    assert main(["scenarios", "your-server"]) == 0
    assert capsys.readouterr().out == (BUILTIN_DIR / "your-server.yaml").read_text(encoding="utf-8")
    assert main(["scenarios", "nope"]) == 2
    assert "no built-in scenario 'nope'" in capsys.readouterr().err


@pytest.mark.parametrize("name", builtin_names())
def test_every_builtin_parses_and_says_what_it_is_for(name):
    scn = load_scenario(resolve_scenario(name))
    row = next(r for r in builtin_scenarios() if r.name == name)
    assert row.description and len(row.description) <= 110
    assert row.embedded_engine == bool(scn.engine)
    if row.embedded_engine:  # said in its description, and when pointed at another server
        assert "embedded reference engine" in row.description
        note = embedded_engine_note(resolve_scenario(name))
        assert note is not None and f"scenario {name} " in note and "your-server" in note
    else:
        assert embedded_engine_note(resolve_scenario(name)) is None


def test_the_template_is_valid_for_capacity_and_comments_every_field():
    from loadgen.capacity.settings import CapacitySettings

    path = resolve_scenario("your-server")
    scn = load_scenario(path)
    settings = CapacitySettings.from_scenario(scn)
    assert (scn.synthetic.input_len.value, scn.synthetic.output_len.value) == (512, 128)
    assert scn.tier_slos == {"standard": {"ttft_ms": 500.0}} and settings.step.quantile == 0.99
    assert (settings.search.start, settings.search.growth, settings.step.step_duration_s) == (1.0, 2.0, 30.0)
    assert settings.search.max_duration_s is not None and scn.lateness_bound_ms == 10
    assert not scn.engine
    fields = [line for line in path.read_text(encoding="utf-8").splitlines()
              if line.strip() and not line.lstrip().startswith("#")]
    uncommented = [line for line in fields if "#" not in line and not line.rstrip().endswith(":")]
    assert not uncommented, uncommented


def test_a_users_copy_of_a_builtin_gets_no_note(tmp_path):
    copy = tmp_path / "chat.yaml"
    shutil.copy(BUILTIN_DIR / "chat.yaml", copy)
    assert embedded_engine_note(copy) is None


@pytest.mark.slow
def test_the_wheel_ships_the_scenarios_and_leaves_torch_to_the_engine_extra(tmp_path):
    src = tmp_path / "src"
    for name in ("loadgen", "engine"):
        shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                        "-q", "-w", str(tmp_path / "dist"), str(src)], capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    (wheel,) = (tmp_path / "dist").glob("slobench-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        meta = email.message_from_string(z.read(next(n for n in names if n.endswith(".dist-info/METADATA")))
                                         .decode())
    assert {f"loadgen/scenarios/{n}.yaml" for n in builtin_names()} <= names
    requires = meta.get_all("Requires-Dist")
    heavy = [req for req in requires if req.split()[0].split(";")[0].split(">")[0].split("=")[0]
             in ("torch", "triton", "transformers", "safetensors")]
    assert heavy and all("extra ==" in req for req in heavy), heavy
    assert any(req.startswith("torch") and 'extra == "engine"' in req for req in heavy)
