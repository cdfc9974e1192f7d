"""Start the reference engine's server as a subprocess on a free loopback port, and stop it after.

``run``/``replay`` use this when no ``--target`` is given. The server's output goes to a log file in
the run folder (never a pipe that could fill up and block it); when it dies or never gets healthy,
the error shows the tail of that log. The engine is the ``engine`` extra: without torch here,
``require_engine`` (and so ``EmbeddedEngine``) ends with ``EngineNotInstalled`` before anything starts.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any


class EngineStartError(RuntimeError):
    pass


ENGINE_EXTRA_MISSING = "the reference engine needs the engine extra: pip install 'slobench[engine]'"


class EngineNotInstalled(Exception):
    """torch is not installed: a usage error (exit 2, one line), not a target that failed."""


def require_engine() -> None:
    """Raise ``EngineNotInstalled`` unless torch can be imported here (the engine runs in this interpreter or
    a subprocess of it). Looked up, not imported: importing torch takes seconds."""
    try:
        missing = importlib.util.find_spec("torch") is None
    except (ImportError, ValueError):  # a broken or half-removed install
        missing = True
    if missing:
        raise EngineNotInstalled(ENGINE_EXTRA_MISSING)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def engine_args(options: Mapping[str, Any]) -> list[str]:
    """Scenario engine options to CLI flags: ``max_num_seqs: 8`` -> ``--max-num-seqs 8``; True -> the bare
    flag, False -> ``--no-<flag>``; lists/dicts are passed as repeated values / JSON."""
    import json

    out: list[str] = []
    for key, value in options.items():
        flag = "--" + str(key).replace("_", "-")
        if value is None:
            continue
        if value is True:
            out.append(flag)
        elif value is False:
            out.append("--no-" + flag[2:])
        elif isinstance(value, dict):
            out += [flag, json.dumps(value)]
        elif isinstance(value, (list, tuple)):
            out += [flag, *map(str, value)]
        else:
            out += [flag, str(value)]
    return out


def wait_healthy(url: str, proc: subprocess.Popen | None, timeout_s: float, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    last = "no answer yet"
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise EngineStartError(
                f"the engine server exited with code {proc.returncode} before it was healthy"
                + tail_text(log)
            )
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:  # noqa: S310 (loopback)
                if r.status == 200:
                    return
                last = f"HTTP {r.status}"
        except urllib.error.HTTPError as e:
            last = f"HTTP {e.code}"
        except (urllib.error.URLError, OSError) as e:
            last = str(getattr(e, "reason", e))
        time.sleep(0.2)
    raise EngineStartError(f"{url}/health was not 200 within {timeout_s:g}s (last: {last})" + tail_text(log))


def tail_text(log: Path | None, n: int = 20) -> str:
    if log is None or not log.exists():
        return ""
    lines = log.read_text(encoding="utf-8", errors="replace").splitlines()[-n:]
    return "\n--- engine server log (last lines) ---\n" + "\n".join(lines) if lines else ""


class EmbeddedEngine:
    """``with EmbeddedEngine(options, log_path) as url: ...`` runs ``python -m engine.server``."""

    def __init__(self, options: Mapping[str, Any] | None = None, log_path: str | Path | None = None,
                 startup_timeout_s: float = 180.0, module: str = "engine.server"):
        if module.split(".")[0] == "engine":
            require_engine()
        self.options = dict(options or {})
        self.log_path = Path(log_path) if log_path else None
        self.startup_timeout_s = startup_timeout_s
        self.module = module
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self._log = None

    def start(self) -> str:
        # --parent-pid: it shuts itself down should we die without stopping it (SIGKILL), as its own session
        # keeps any signal sent to ours from it
        cmd = [sys.executable, "-m", self.module, "--host", "127.0.0.1", "--port", str(self.port),
               "--parent-pid", str(os.getpid()), *engine_args(self.options)]
        if self.log_path is None:
            self.log_path = Path(os.devnull)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")  # noqa: SIM115 (closed in stop)
        repo = Path(__file__).resolve().parents[2]
        path = os.pathsep.join(filter(None, [str(repo), os.environ.get("PYTHONPATH")]))
        env = {**os.environ, "PYTHONPATH": path}
        self.proc = subprocess.Popen(  # a new session: our Ctrl-C is not its Ctrl-C, we stop it ourselves
            cmd, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
            start_new_session=True,
        )
        try:
            wait_healthy(self.url, self.proc, self.startup_timeout_s, self.log_path)
        except BaseException:
            self.stop()
            raise
        return self.url

    def died(self) -> str | None:
        """None while the server runs; else a message with its exit code and log tail."""
        if self.proc is None or self.proc.poll() is None:
            return None
        code = self.proc.returncode
        return f"the engine server exited with code {code} during the run" + tail_text(self.log_path)

    def stop(self, grace_s: float = 10.0) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
