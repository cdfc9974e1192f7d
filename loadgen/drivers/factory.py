"""Which driver a run uses: ``--driver aiohttp`` (one process, or the sharded replayer with
``--workers N``) or ``--driver locust`` (``--workers`` Locust processes)."""

from __future__ import annotations

from pathlib import Path

from loadgen.drivers.base import Driver, RecordSink
from loadgen.drivers.http_request import ClientConfig

DRIVERS = ("aiohttp", "locust")


def make_driver(kind: str, cfg: ClientConfig, sink: RecordSink, *, workers: int = 1, work_dir: str | Path = ".",
                drain_s: float | None = None, tier_slos: dict | None = None) -> Driver:
    if kind == "locust":
        from loadgen.drivers.locust.driver import LocustDriver  # no Locust import: it runs in its own process

        return LocustDriver(cfg, sink, Path(work_dir) / "locust", processes=workers, drain_s=drain_s,
                            tier_slos=tier_slos)
    if kind != "aiohttp":
        raise ValueError(f"unknown driver {kind!r} (expected one of {', '.join(DRIVERS)})")
    if workers > 1:
        from loadgen.drivers.sharded import ShardedReplayer

        return ShardedReplayer(cfg, sink, workers)
    from loadgen.drivers.replayer import Replayer

    return Replayer(cfg, sink)
