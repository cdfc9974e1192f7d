"""A dense sweep: each of a list of fixed loads measured once with the capacity step machinery (the same
windows, warm-up and judgement as a search's steps), for benchmarks that compare the search with the truth of
many windows (``capacity_bench.py``, ``knee_windows.py``)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from loadgen.capacity.plan import CapacityPlan
from loadgen.capacity.step import CapacityRunner
from loadgen.drivers.event_loop import run_sync
from loadgen.scenario.model import Scenario


def measure_fixed(scn: Scenario, loads: Iterable[float], run_dir: str | Path, *, target: str,
                  early_stop: bool = False, display=None, fresh_draws: bool = False) -> list[dict[str, Any]]:
    """Measure each load once with the capacity step machinery (a dense sweep, for comparison with the
    search); returns the step details. ``requests.jsonl`` stages are the loads' positions. Every load is
    on the common arrival draw (0), scaled; ``fresh_draws``: the i-th on draw i + 1 (a load given several
    times is then several independent windows)."""
    plan = CapacityPlan.from_scenario(scn)

    async def main():
        runner = CapacityRunner(plan, Path(run_dir), target, display=display)
        await runner.open()
        out = []
        try:
            for i, load in enumerate(loads):
                res = await runner.measure(load, "sweep", i, early_stop=early_stop, draw=i + 1 if fresh_draws else 0)
                out.append(res.detail)
                if display:
                    display.end_step(res.detail)
                if runner.stopped:
                    break
        finally:
            await runner.close()
        return out

    return run_sync(main)
