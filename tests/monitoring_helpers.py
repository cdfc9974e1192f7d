"""Helpers for the watch and export-monitoring tests: a capacity run folder with a chosen rated step, the
commands' parsers (as cli.py would build them), and a background load of streamed completions."""

from __future__ import annotations

import argparse
import io
import json
import threading
import urllib.request
from pathlib import Path

from loadgen.commands import export_monitoring, watch
from loadgen.commands.common import UsageError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # as cli.py's: a usage error, not SystemExit
        raise UsageError(f"{self.prog}: {message}")


def parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="slobench")
    sub = ap.add_subparsers(dest="cmd", required=True, parser_class=_Parser)
    watch.register(sub)
    export_monitoring.register(sub)
    return ap


def capacity_summary(ttft_p99_ms=300.0, output_tok_s=1000.0, kv_usage=0.10, batch_fill=0.60, rejections=0,
                     running=10.0, max_num_seqs=16, rated=1) -> dict:
    """A capacity summary.json with three steps (two pass, the heaviest fails) whose rated step (index
    ``rated``, named by ``rated_capacity.step``) carries the given figures; the others carry different ones,
    so a test sees which step was read."""
    def step(index, load, passed, scale):
        return {"index": index, "load": load, "phase": "ramp", "passed": passed, "counted": True,
                "duration_s": 20.0, "window_s": [3.0, 20.0], "output_tok_s": output_tok_s * scale,
                "kv_usage": kv_usage * scale, "batch_fill_ratio": batch_fill * scale,
                "batch_fill_source": "slobench:batch_fill_ratio", "server_running": running * scale,
                "admission_rejections": rejections, "admission_rejections_client": rejections,
                "summary": {"p99_ttft_ms": ttft_p99_ms * scale, "median_ttft_ms": ttft_p99_ms * scale / 3}}
    steps = [step(0, 4.0, True, 0.5), step(1, 8.0, True, 1.0), step(2, 16.0, False, 3.0)]
    return {"kind": "capacity", "verdict": "rated", "engine": {"model": "tiny", "max_num_seqs": max_num_seqs},
            "rated_capacity": {"rate_rps": steps[rated]["load"], "step": rated}, "steps": steps}


def write_run(folder: Path, **figures) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "summary.json").write_text(json.dumps(capacity_summary(**figures)))
    return folder


def run_watch(*argv) -> tuple[int, list[dict]]:
    """``slobench watch ARGV --json`` through the command function: (exit code, the JSON lines)."""
    args = parser().parse_args(["watch", *map(str, argv), "--json"])
    out = io.StringIO()
    code = watch.cmd_watch(args, out=out)
    return code, [json.loads(line) for line in out.getvalue().splitlines()]


class Load:
    """``users`` threads sending streamed completions back to back until ``stop()``."""

    def __init__(self, url: str, users: int, max_tokens: int = 16, model: str = "mock"):
        body = {"model": model, "prompt": "one two three four five six seven eight", "max_tokens": max_tokens,
                "stream": True, "ignore_eos": True}
        self.url, self.body = url.rstrip("/") + "/v1/completions", json.dumps(body).encode()
        self.done, self.errors = 0, []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._user, daemon=True) for _ in range(users)]

    def _user(self) -> None:
        while not self._stop.is_set():
            req = urllib.request.Request(self.url, self.body, {"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=30) as r:  # noqa: S310 (loopback)
                    r.read()
                self.done += 1
            except Exception as e:  # noqa: BLE001 (an engine's 429 is load too; kept to show on failure)
                self.errors.append(repr(e))
                self._stop.wait(0.05)  # a refusal comes back at once: do not spin on it

    def __enter__(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(30)
