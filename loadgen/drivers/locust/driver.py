"""Run a Locust process for slobench's own commands (``slobench run --driver locust``, the capacity search).

Locust monkey-patches the standard library with gevent when it is imported, so it never runs inside
slobench's asyncio process: this module writes the request specs to a file, starts
``python -m locust -f loadgen/drivers/locust/locustfile.py --headless --slobench-specs FILE`` (``--processes N``
for more load generators), and reads back the records its master gathered into ``requests.jsonl``, in
the same format as the aiohttp replayer's. Importing this module does not import Locust.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path

from loadgen.drivers.locust.plan import write_specs
from loadgen.results.records import RequestRecord, read_records
from loadgen.workload.specs import RequestSpec

LOCUSTFILE = Path(__file__).resolve().with_name("locustfile.py")
REPO = Path(__file__).resolve().parents[3]
EXIT_SLO_BROKEN = 3


class LocustRunError(RuntimeError):
    pass


def discover_model(target: str, timeout: float = 10.0) -> str:
    from loadgen.drivers.replayer import TargetError

    try:
        with urllib.request.urlopen(target.rstrip("/") + "/v1/models", timeout=timeout) as r:  # noqa: S310
            data = json.loads(r.read()).get("data") or []
    except OSError as e:
        raise TargetError(f"cannot reach {target}: {type(e).__name__}: {e}") from e
    if not data:
        raise TargetError(f"{target}/v1/models lists no model; pass --model")
    return data[0]["id"]


def locust_command(target: str, out_dir: Path, specs_path: Path, *, processes: int = 1, max_connections: int = 0,
                   read_timeout_s: float | None = 300.0, drain_s: float | None = None,
                   extra: Sequence[str] = ()) -> list[str]:
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
                 duration_s: float | None = None, t0: float | None = None, extra: Sequence[str] = ()):
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.target = target.rstrip("/")
        self.model = model or discover_model(self.target)
        self.specs_path = write_specs(self.out_dir / "locust_specs.pkl", list(specs), concurrency=concurrency,
                                      model=self.model, tier_slos=tier_slos, stage=stage, start_s=start_s,
                                      duration_s=duration_s)
        extra = [*extra, "--slobench-t0", repr(t0)] if t0 is not None else list(extra)
        (self.out_dir / "start.json").unlink(missing_ok=True)
        self.cmd = locust_command(self.target, self.out_dir, self.specs_path, processes=processes,
                                  max_connections=max_connections, read_timeout_s=read_timeout_s, extra=extra)
        self.proc: subprocess.Popen | None = None
        self._log = None

    def start(self) -> LocustProcess:
        self._log = open(self.out_dir / "locust.log", "ab")  # noqa: SIM115 (closed in wait)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
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

    def wait(self, poll: Callable[[], None] | None = None, timeout_s: float | None = None) -> int:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        try:
            while self.proc.poll() is None:
                if poll:
                    poll()
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


def run_locust(specs: Sequence[RequestSpec], opts, req_path: Path, met_path: Path) -> tuple[str | None, str | None]:
    """``runner.execute``'s Locust path: the same inputs and outputs as its aiohttp paths (records in
    ``req_path``, the scrape in ``met_path``); returns (why it stopped early or None, model)."""
    from loadgen.target.scrape import Scraper

    cfg = opts.client
    lp = LocustProcess(specs, cfg.target, req_path.parent, model=cfg.model, concurrency=opts.concurrency,
                       processes=opts.workers, stage=cfg.stage, max_connections=cfg.max_connections,
                       read_timeout_s=cfg.read_timeout_s, tier_slos=opts.tier_slos)
    scraper = Scraper(cfg.target, met_path).start() if opts.scrape else None
    stopped: str | None = None
    scraping = False
    display = None
    old = signal.getsignal(signal.SIGINT)

    def on_sigint(*_):
        nonlocal stopped
        stopped = stopped or "interrupted (Ctrl-C)"
        lp.stop()

    def poll():
        nonlocal scraping, stopped
        if scraper and not scraping and (t0 := lp.t0()) is not None:
            scraper.go(t0)
            scraping = True
        if opts.watch and not stopped and (reason := opts.watch()):
            stopped = reason
            lp.stop()
        if display:
            from loadgen.fixed_load import _recent_ttfts

            ttfts = _recent_ttfts(req_path)
            n = _count_lines(req_path)
            display.update(n, 0, n, 0, ttfts)

    signal.signal(signal.SIGINT, on_sigint)
    try:
        lp.start()
        if opts.progress:
            from loadgen.fixed_load import _Display

            display = _Display(len(specs))
        rc = lp.wait(poll)
    finally:
        signal.signal(signal.SIGINT, old)
        if display:
            display.close()
        if scraper:
            scraper.stop()
    if rc not in (0, 1) and not stopped:  # 1: Locust's "some requests failed", the records say which
        stopped = f"locust exited with code {rc}: {lp.log_tail(5)}"
    return stopped, lp.model


def run_stage(specs: Sequence[RequestSpec], target: str, out_dir: str | Path, *, stage: int = 0,
              concurrency: int = 0, start_s: float = 0.0, duration_s: float | None = None, t0: float | None = None,
              processes: int = 1, model: str | None = None, records_path: str | Path | None = None,
              max_connections: int = 0, read_timeout_s: float | None = 300.0, drain_s: float | None = None,
              timeout_s: float | None = None) -> list[RequestRecord]:
    """One fixed-load stage through Locust, for the capacity search; returns its records (``stage`` set).

    Open loop: each spec is sent at its ``arrival_s``; closed loop: ``concurrency`` users go through the
    specs (round them until ``start_s + duration_s`` when ``duration_s`` is given). With ``t0`` (a
    ``time.monotonic()`` instant of this machine, e.g. the search's clock) every time, ``arrival_s``
    included, is on that clock, so the stage's records join the search's timeline as they are; leave
    Locust a couple of seconds to start (``start_s`` >= now + 2 s, 3 s with ``processes`` > 1): a
    request whose time has passed is sent late and its lateness recorded. With ``records_path`` the
    records are also appended there. Raises :class:`LocustRunError` when Locust fails."""
    out_dir = Path(out_dir)
    lp = LocustProcess(specs, target, out_dir, model=model, concurrency=concurrency, processes=processes,
                       stage=stage, max_connections=max_connections, read_timeout_s=read_timeout_s,
                       start_s=start_s, duration_s=duration_s, t0=t0,
                       extra=["--slobench-drain-s", str(drain_s)] if drain_s is not None else ())
    rc = lp.start().wait(timeout_s=timeout_s)
    path = out_dir / "requests.jsonl"
    lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
    if rc not in (0, 1) and not lines:
        raise LocustRunError(f"locust exited with code {rc}:\n{lp.log_tail()}")
    recs = [RequestRecord(**r) for r in read_records(path)] if lines else []
    if records_path is not None and lines:
        with open(records_path, "a", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
    return recs


def _count_lines(path: Path) -> int:
    try:
        with open(path, "rb") as f:
            return sum(buf.count(b"\n") for buf in iter(lambda: f.read(1 << 16), b""))
    except OSError:
        return 0
