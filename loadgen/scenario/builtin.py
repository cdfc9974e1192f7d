"""The built-in scenarios: YAML files shipped inside the package (``loadgen/scenarios/``), named on the command
line (``slobench capacity chat``) and listed by ``slobench scenarios``.

A scenario argument is a file path when such a file exists, else a built-in's name (``chat`` or ``chat.yaml``).
Each built-in's first comment line is its description. One with an ``engine:`` section is tuned for the
embedded reference engine (the ``tiny`` model, token-id prompts, a lateness bound for a shared 2-core
machine): ``embedded_engine_note`` is the warning to print when it is pointed at another server.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import yaml

from loadgen.scenario.model import ScenarioError
from loadgen.workload.specs import DEFAULT_TOKEN_RANGE

BUILTIN_DIR = Path(__file__).resolve().parents[1] / "scenarios"
TEMPLATE = "your-server"  # the built-in to start from for one's own server


class BuiltinScenario(NamedTuple):
    name: str
    description: str
    embedded_engine: bool  # it has an `engine:` section: tuned for the embedded reference engine


def builtin_names() -> list[str]:
    return sorted(p.stem for p in BUILTIN_DIR.glob("*.yaml"))


def builtin_path(name: str) -> Path | None:
    """The built-in called ``name`` (with or without ``.yaml``), or None."""
    stem = name[:-5] if name.endswith(".yaml") else name
    if not stem or "/" in stem or "\\" in stem:
        return None
    path = BUILTIN_DIR / f"{stem}.yaml"
    return path if path.is_file() else None


def resolve_scenario(text: str | Path) -> Path:
    """The scenario file a command-line argument names: an existing file wins, else a built-in's name; else a
    ScenarioError listing the built-ins."""
    path = Path(text).expanduser()
    if path.is_file():
        return path
    found = builtin_path(str(text))
    if found is not None:
        return found
    kind = "a folder, not a scenario file" if path.is_dir() else "no such file"
    raise ScenarioError(f"scenario {str(text)!r}: {kind}, and no built-in scenario of that name "
                        f"(built in: {', '.join(builtin_names())}; `slobench scenarios` describes them)")


def description(path: Path) -> str:
    """The file's first comment line."""
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            return line.lstrip("#").strip()
        if line.strip():
            break
    return ""


def is_builtin(path: str | Path) -> bool:
    try:
        return Path(path).resolve().parent == BUILTIN_DIR and Path(path).suffix == ".yaml"
    except OSError:
        return False


def _raw(path: Path) -> dict:
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return {}
    return raw if isinstance(raw, dict) else {}


def builtin_scenarios() -> list[BuiltinScenario]:
    """Every built-in, by name: its description and whether it is tuned for the embedded engine."""
    out = []
    for name in builtin_names():
        path = BUILTIN_DIR / f"{name}.yaml"
        out.append(BuiltinScenario(name, description(path), "engine" in _raw(path)))
    return out


def embedded_engine_note(scenario_path: str | Path) -> str | None:
    """One line to print when a built-in tuned for the embedded reference engine is given ``--target``: what it
    assumes, and where to start instead. None for any other scenario (a user's own file, a built-in without an
    ``engine:`` section)."""
    path = Path(scenario_path)
    if not is_builtin(path):
        return None
    raw = _raw(path)
    engine = raw.get("engine")
    if not isinstance(engine, dict):
        return None
    workload = raw.get("workload") if isinstance(raw.get("workload"), dict) else {}
    lo, hi = workload.get("token_range") or DEFAULT_TOKEN_RANGE
    client = raw.get("client") if isinstance(raw.get("client"), dict) else {}
    parts = [f"the {engine['model']} model" if engine.get("model") else "its engine: section",
             f"token ids in [{lo}, {hi})"]
    if client.get("lateness_bound_ms") is not None:
        parts.append(f"a {client['lateness_bound_ms']:g} ms lateness bound for a shared 2-core machine")
    return (f"note: scenario {path.stem} is tuned for the embedded reference engine ({', '.join(parts)}); "
            f"against your own server start from `slobench scenarios {TEMPLATE} > my.yaml`")
