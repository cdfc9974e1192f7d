"""Run metadata shared by every summary.json: its ``schema_version``, versions, git commit, machine, start time.

Nothing here imports torch or the engine: versions come from installed package metadata.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
import platform
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from loadgen.results.rundir import SCHEMA_VERSION

REPO = Path(__file__).resolve().parents[2]


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).astimezone().isoformat(timespec="seconds")


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def slobench_version() -> str:
    """The installed distribution's version, else the checkout's ``pyproject.toml`` (a source tree run
    without installing), else ``unknown``."""
    installed = _version("slobench")
    if installed:
        return installed
    try:
        text = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    except OSError:
        return "unknown"
    project = text.split("[project]", 1)[-1].split("\n[", 1)[0]  # the [project] table alone
    m = re.search(r'^version\s*=\s*"([^"]+)"', project, re.MULTILINE)
    return m.group(1) if m else "unknown"


def versions() -> dict[str, str]:
    out = {"slobench": slobench_version(), "python": platform.python_version()}
    for dist in ("torch", "aiohttp", "numpy"):
        v = _version(dist)
        if v:
            out[dist] = v
    return out


def git_commit(repo: Path = REPO) -> str | None:
    """HEAD of the slobench checkout, with ``-dirty`` when tracked files differ; None outside git."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, timeout=5)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo,
                               capture_output=True, text=True, timeout=5)
        return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def machine() -> dict[str, Any]:
    out: dict[str, Any] = {"platform": platform.platform(), "machine": platform.machine(),
                           "cpus": os.cpu_count(), "hostname": platform.node()}
    with contextlib.suppress(OSError):
        out["load_avg_1m"] = round(os.getloadavg()[0], 2)
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                out["cpu_model"] = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return out


def run_metadata(kind: str, run_id: str, *, scenario: dict[str, Any] | None, target: str | None,
                 started_at: str, driver: str = "aiohttp") -> dict[str, Any]:
    """The metadata keys every summary carries (``valid`` is the caller's)."""
    return {"schema_version": SCHEMA_VERSION, "kind": kind, "run_id": run_id, "scenario": scenario,
            "target": target, "driver": driver,
            "started_at": started_at, "versions": versions(), "git_commit": git_commit(), "machine": machine(),
            "argv": redacted_argv(sys.argv)}


SECRET_FLAGS = ("--api-key", "--header")  # their values may be credentials: never written to a run folder


def redacted_argv(argv: list[str]) -> list[str]:
    """The command line with the values of ``SECRET_FLAGS`` replaced by ``***`` (a header keeps its name)."""
    out: list[str] = []
    for arg in argv:
        flag, eq, value = arg.partition("=")
        if out and out[-1] in SECRET_FLAGS and not eq:
            out.append(_hidden(out[-1], arg))
        elif eq and flag in SECRET_FLAGS:
            out.append(f"{flag}={_hidden(flag, value)}")
        else:
            out.append(arg)
    return out


def _hidden(flag: str, value: str) -> str:
    name, sep, _ = value.partition(":")
    return f"{name}: ***" if flag == "--header" and sep else "***"
