"""Locust as a slobench driver (``slobench run --driver locust``, ``slobench capacity --driver locust``).

Locust monkey-patches the standard library with gevent when it is imported, so it never runs inside
slobench's asyncio process: :class:`LocustDriver` writes each run's request specs to a file, starts
``python -m locust -f loadgen/drivers/locust/locustfile.py --headless --slobench-specs FILE``
(``--processes N`` for more load generators) on slobench's own clock (``--slobench-t0``), and follows
the ``requests.jsonl`` its master writes, handing each record to the run's sink as it arrives (within
about a second: workers report once a second). Importing this module does not import Locust.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from loadgen.drivers.base import Progress, RecordSink
from loadgen.drivers.http_request import ClientConfig
from loadgen.drivers.locust.stages import write_specs
from loadgen.results.records import RequestRecord
from loadgen.target.access import check_target
from loadgen.workload.specs import RequestSpec

LOCUSTFILE = Path(__file__).resolve().with_name("locustfile.py")
REPO = Path(__file__).resolve().parents[3]
EXIT_SLO_BROKEN = 3


class LocustRunError(RuntimeError):
    pass


def locust_command(target: str, out_dir: Path, specs_path: Path, *, processes: int = 1, max_connections: int = 0,
                   read_timeout_s: float | None = 300.0, drain_s: float | None = None,
                   extra: Sequence[str] = ()) -> list[str]:
    """The headless Locust command line; ``drain_s`` (how long in-flight requests may take after the last
    send) defaults to the read timeout."""
    cmd = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "--host", target,
           "--slobench-specs", str(specs_path), "--slobench-out", str(out_dir), "--slobench-no-summary",
           "--slobench-no-slo-stop", "--only-summary", "--loglevel", "WARNING"]
    if processes > 1:
        cmd += ["--processes", str(processes)]
    if max_connections:
        cmd += ["--slobench-max-connections", str(max_connections)]
    if read_timeout_s:
        cmd += ["--slobench-read-timeout", str(read_timeout_s)]
    cmd += ["--slobench-drain-s", str(drain_s if drain_s is not None else (read_timeout_s or 300.0))]
    return [*cmd, *extra]


class LocustProcess:
    """One headless Locust run of fixed specs; output in ``out_dir`` (``locust.log``, ``requests.jsonl``)."""

    def __init__(self, specs: Sequence[RequestSpec], target: str, out_dir: str | Path, *, model: str | None = None,
                 concurrency: int = 0, processes: int = 1, stage: int = 0, max_connections: int = 0,
                 read_timeout_s: float | None = 300.0, tier_slos: dict | None = None, start_s: float = 0.0,
                 duration_s: float | None = None, t0: float | None = None, drain_s: float | None = None,
                 extra: Sequence[str] = (), headers: dict[str, str] | None = None,
                 extra_body: dict | None = None):
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.target = target.rstrip("/")
        self.model = model or check_target(self.target, None, headers or {})
        self.specs_path = write_specs(self.out_dir / "locust_specs.pkl", list(specs), concurrency=concurrency,
                                      model=self.model, tier_slos=tier_slos, stage=stage, start_s=start_s,
                                      duration_s=duration_s)
        extra = [*extra, "--slobench-t0", repr(t0)] if t0 is not None else list(extra)
        (self.out_dir / "start.json").unlink(missing_ok=True)
        self.cmd = locust_command(self.target, self.out_dir, self.specs_path, processes=processes,
                                  max_connections=max_connections, read_timeout_s=read_timeout_s, drain_s=drain_s,
                                  extra=extra)
        self.proc: subprocess.Popen | None = None
        self._log = None
        # the environment, not the command line: a header may hold a secret, and `ps` shows arguments
        self.env = {"SLOBENCH_HEADERS": json.dumps(headers or {}), "SLOBENCH_EXTRA_BODY": json.dumps(extra_body or {})}

    def start(self) -> LocustProcess:
        self._log = open(self.out_dir / "locust.log", "ab")  # noqa: SIM115 (closed in wait)
        env = {**os.environ, **self.env,
               "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
        self.proc = subprocess.Popen(self.cmd, cwd=REPO, stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        return self

    def t0(self) -> float | None:
        """The run start on this machine's monotonic clock, once the Locust master has picked it."""
        try:
            return json.loads((self.out_dir / "start.json").read_text())["t0_mono"]
        except (OSError, ValueError, KeyError):
            return None

    def stop(self) -> None:
        """Like Ctrl-C: Locust stops, requests in flight are recorded as cancelled, records are saved."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def wait(self, timeout_s: float | None = None) -> int:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        try:
            while self.proc.poll() is None:
                if deadline and time.monotonic() > deadline:
                    self.stop()
                    deadline = None
                time.sleep(0.2)
            return self.proc.returncode
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(5)
            if self._log:
                self._log.close()
                self._log = None
            self.specs_path.unlink(missing_ok=True)

    def log_tail(self, n: int = 15) -> str:
        try:
            lines = (self.out_dir / "locust.log").read_text(errors="replace").splitlines()[-n:]
        except OSError:
            return ""
        return "\n".join(lines)


class RecordFollower:
    """Reads the records a Locust master appends to its ``requests.jsonl``, as they come."""

    def __init__(self, path: Path):
        self.path = path
        self._pos = 0
        self._rest = b""

    def new_records(self) -> list[RequestRecord]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self._pos)
                data = f.read()
        except FileNotFoundError:
            return []
        self._pos += len(data)
        *lines, self._rest = (self._rest + data).split(b"\n")
        return [RequestRecord(**json.loads(line)) for line in lines if line.strip()]


class LocustDriver:
    """``drivers.base.Driver`` through one headless Locust run per ``run()`` (``processes`` load
    generators), in ``work_dir/stageK/``. Locust cannot stop sending without stopping: ``stop_sending()``
    ends the run like ``stop()`` (requests in flight are recorded as cancelled), and ``in_flight()`` is
    None, so a capacity step driven by Locust never stops early. ``progress.sent`` counts records
    received."""

    name = "locust"
    measures_in_flight = False

    def __init__(self, cfg: ClientConfig, sink: RecordSink, work_dir: str | Path, *, processes: int = 1,
                 drain_s: float | None = None, tier_slos: dict | None = None, progress: Progress | None = None):
        self.cfg, self.sink, self.work_dir = cfg, sink, Path(work_dir)
        self.processes = processes
        self.drain_s = drain_s
        self.tier_slos = tier_slos or {}
        self.model = cfg.model
        self.progress = progress or Progress()
        self.abort_reason: str | None = None
        self.start_lead_s = 3.0 if processes > 1 else 2.0  # Locust's own start-up before the first send
        self._proc: LocustProcess | None = None
        self._stopped = False

    async def open(self) -> None:
        if self.model is None:
            self.model = await asyncio.get_running_loop().run_in_executor(None, check_target, self.cfg.target, None,
                                                                         self.cfg.headers)

    async def run(self, specs: Iterable[RequestSpec], *, t0: float, stage: int, concurrency: int = 0,
                  until_s: float | None = None) -> None:
        specs = list(specs)
        start = min((s.arrival_s for s in specs), default=0.0)
        out_dir = self.work_dir / f"stage{stage}"
        (out_dir / "requests.jsonl").unlink(missing_ok=True)
        cfg = self.cfg
        self._stopped = False
        lp = LocustProcess(specs, cfg.target, out_dir, model=self.model, concurrency=concurrency,
                           processes=self.processes, stage=stage, max_connections=cfg.max_connections,
                           read_timeout_s=cfg.read_timeout_s, tier_slos=self.tier_slos, start_s=start,
                           duration_s=(until_s - start) if concurrency and until_s is not None else None,
                           t0=t0, drain_s=self.drain_s,
                           extra=["--slobench-shape", json.dumps(cfg.shape.as_dict())], headers=cfg.headers,
                           extra_body=cfg.extra_body)
        follow = RecordFollower(out_dir / "requests.jsonl")
        self._proc = lp.start()
        rc = None
        try:
            while lp.proc.poll() is None:
                self._take(follow.new_records())
                await asyncio.sleep(0.2)
        finally:
            if lp.proc.poll() is None:  # cancelled: stop Locust, keep what it saved
                lp.stop()
            rc = await asyncio.get_running_loop().run_in_executor(None, lp.wait)
            self._take(follow.new_records())
            self._proc = None
        if rc not in (0, 1) and not self._stopped:  # 1: Locust's "some requests failed", the records say which
            self.abort_reason = self.abort_reason or f"locust exited with code {rc}: {lp.log_tail(5)}"

    async def warm_up(self, connections: int) -> None:
        """Nothing to do here: Locust's users open their own connections in Locust's processes, so the
        first requests of each Locust run pay for their TCP handshakes (one loopback round trip each)."""
        return None

    def _take(self, records: list[RequestRecord]) -> None:
        for rec in records:
            self.progress.sent += 1
            self.progress.finished(rec)
            self.sink.write(rec)

    def in_flight(self) -> None:
        return None  # in the Locust processes

    def stop_sending(self) -> None:
        self.stop()

    def stop(self, reason: str | None = None) -> None:
        if reason and not self.abort_reason:
            self.abort_reason = reason
        self._stopped = True
        if self._proc is not None:
            self._proc.stop()

    async def close(self) -> None:
        if self._proc is not None:
            self.stop()
