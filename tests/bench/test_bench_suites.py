"""The benchmark suites (``python -m bench``): the listing, the quick modes of the suites that need nothing
beyond ``make setup``, and ``docs/validation.md``'s figures checked against the results files they cite."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench.suites import SUITES

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "bench" / "results"
VALIDATION = REPO / "docs" / "validation.md"
CITE = re.compile(r"`bench/results/([\w.-]+\.json)`(?: \(([^)]*)\))?")
# a figure as the docs print it: 1,059 / 45.6 / −0.5 / 0.98×; not a name's digits (p99, H100, calibrate-steady)
FIGURE = re.compile(r"(?<![\w.,/-])([−+-]?)(\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+\.\d+|\d{3,})(?![\w/])")


def bench(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bench", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


def test_the_listing_names_every_suite_and_part():
    r = bench("--list")
    assert r.returncode == 0, r.stderr
    for suite in SUITES.values():
        assert f"{suite.name}: " in r.stdout
        for part in suite.parts:
            assert f"  {part.name}: " in r.stdout


def test_an_unknown_suite_or_part_is_one_line_and_exit_2():
    for args in (("nosuch",), ("client", "--part", "nosuch")):
        r = bench(*args)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and r.stderr.startswith("error: "), r.stderr


def numbers(value) -> list[float]:
    """Every number in a results file: its numeric values, and the figures its texts print (an experiment's
    ``measured`` line)."""
    if isinstance(value, bool):
        return []
    if isinstance(value, str):
        return [float(n.replace(",", "")) for _s, n in FIGURE.findall(value)]
    if isinstance(value, (int, float)):
        return [float(value)] if math.isfinite(value) else []
    if isinstance(value, dict):
        return [x for v in value.values() for x in numbers(v)]
    if isinstance(value, list):
        return [x for v in value for x in numbers(v)]
    return []


def shown_in(figure: str, values: list[float]) -> bool:
    """Whether a printed figure is one of the values, rounded as printed: as it is, as a percentage of a
    fraction, or as a percentage change of a ratio (1.012 printed +1.2 %)."""
    figure = figure.lstrip("−+-").replace(",", "")
    x = float(figure)
    places = len(figure.split(".")[1]) if "." in figure else 0
    for v in values:
        for shown in (v, 100 * v, 100 * (v - 1)):
            if abs(round(abs(shown), places) - x) < 0.5 * 10 ** -places + 1e-9:
                return True
    return False


def validation_rows() -> list[tuple[str, str, list[str], list[str]]]:
    """(row text, results file, parts, the row's figures) for every table row citing one results file; a
    figure is a number outside code spans (settings and commands are in backticks)."""
    rows = []
    for line in VALIDATION.read_text(encoding="utf-8").splitlines():
        if not line.startswith("|") or "bench/results/" not in line:
            continue
        cites = CITE.findall(line)
        files = {f for f, _p in cites}
        assert len(files) == 1, f"a row cites one results file: {line[:120]}"
        parts = [p.strip("` ") for _f, ps in cites for p in ps.split(",") if p.strip("` ")]
        # the figures: every cell but the command(s) and the citation
        cells = [c for c in line.strip("|").split("|") if "python " not in c and "bench/results/" not in c
                 and "slobench " not in c]
        figures = [sign + num for c in cells for sign, num in FIGURE.findall(re.sub(r"`[^`]*`", "", c))]
        rows.append((line, files.pop(), parts, figures))
    return rows


def test_every_results_file_is_one_suites_current_file_and_cited():
    cited = {f for _l, f, _p, _n in validation_rows()}
    files = {p.name for p in RESULTS.glob("*.json")}
    suite_files = {f"{s}.json" for s in SUITES}
    assert files <= suite_files, f"not a suite's results file: {files - suite_files}"
    assert files == cited, f"uncited: {files - cited}; cited but missing: {cited - files}"
    for name in files:
        data = json.loads((RESULTS / name).read_text())
        suite = SUITES[name.removesuffix(".json")]
        assert data["suite"] == suite.name and set(data["parts"]) <= {p.name for p in suite.parts}
        for part in data["parts"].values():
            assert part["quick"] is False and part["command"].startswith(("python ", "taskset "))
            measured = part["measured"]
            assert measured.get("commit") or measured.get("recorded_in_commit"), part["command"]


def test_every_figure_in_validation_is_in_the_results_file_it_cites():
    missing = []
    for line, name, parts, figures in validation_rows():
        data = json.loads((RESULTS / name).read_text())
        assert parts, f"a row names the part(s) it cites: {line[:120]}"
        for part in parts:
            assert part in data["parts"], f"{name} has no part {part!r}"
        values = numbers([data["parts"][p]["result"] for p in parts])
        missing += [f"{f} ({name}: {', '.join(parts)}): {line[:80]}" for f in figures if not shown_in(f, values)]
    assert not missing, "figures not in their results files:\n" + "\n".join(missing)


def quick_parts() -> dict[str, list[str]]:
    """Suite -> the parts to run quick: each script that needs nothing beyond `make setup` once (two parts of
    one script differ only in their arguments)."""
    seen, out = set(), {}
    for s in SUITES.values():
        for p in s.parts:
            if not p.needs and p.script not in seen:
                seen.add(p.script)
                out.setdefault(s.name, []).append(p.name)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("suite", sorted(quick_parts()))
def test_each_suite_that_needs_nothing_runs_quick(suite, tmp_path):
    out = tmp_path / f"{suite}.json"
    parts = quick_parts()[suite]
    r = bench(suite, "--quick", "--out", str(out), *[a for p in parts for a in ("--part", p)], timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    data = json.loads(out.read_text())
    assert list(data["parts"]) == parts
    for part in data["parts"].values():
        assert part["quick"] is True and part["result"] and part["measured"]["wall_s"] > 0
