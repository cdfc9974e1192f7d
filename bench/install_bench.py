"""What a new user's install costs: the client alone against the client with the reference engine, and the time
from an empty virtualenv to the first rating.

    python bench/install_bench.py [--out bench/results/install.json] [--python python3] [--torch 2.13.0]
                                  [--skip client engine rating]

Each part runs in a fresh virtualenv (``python -m venv``) in a temporary folder, installing slobench from the
committed tree (``git archive HEAD``: what a clone of this commit installs), with pip's download cache off
(``--no-cache-dir``: every package is fetched as a first install fetches it; this machine's pip configuration
may serve some from a local mirror, which the file records):

1. ``client``: ``pip install .``: wall time, the virtualenv's size on disk (``du``), the packages installed, and
   whether torch, triton, transformers or any ``nvidia-*`` package came with it;
2. ``engine``: ``pip install torch==VERSION`` first (on a machine without a GPU, the CPU wheel that
   ``scripts/install-torch.sh`` installs: pip's find-links may hold it on disk), then ``pip install '.[engine]'``:
   each step's time, the size, and ``slobench generate`` once to show the engine runs;
3. ``rating``: from nothing to the first rating: create the virtualenv, ``pip install .``, start that
   virtualenv's ``slobench mock-server`` as ``slobench calibrate`` starts it (16 slots, 20 ms + 0.1 ms per
   prompt token of prefill, 20 ms between tokens: the calibration target), and run ``slobench capacity --target
   URL --slo ttft:150 --input-len 256 --output-len 16`` (the calibration workload as flags, ``--rating-arg``
   adds more) until it prints the rating; each step's time and the total.

Results go to ``--out`` (overwritten) with the commit, the date, the machine and the Python and pip versions.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from loadgen.results.runmeta import git_commit, machine, now_iso
from loadgen.target.embedded import free_port, wait_healthy

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "triton", "transformers", "safetensors")
MOCK = ("--slots", "16", "--prefill-ms-per-token", "0.1", "--ttft-ms", "20", "--itl-ms", "20")
RATING = ("--slo", "ttft:150", "--input-len", "256", "--output-len", "16", "--set", "search.start=4",
          "--set", "client.lateness_bound_ms=50")  # calibrate.yaml's ramp start and its bound for a shared 2-core box


def timed(cmd: list[str], log: Path, timeout: float = 1800) -> float:
    """Run ``cmd`` (output appended to ``log``); its wall time; SystemExit with the log's tail on failure."""
    t0 = time.monotonic()
    with log.open("a") as f:
        f.write(f"$ {' '.join(cmd)}\n")
        f.flush()
        r = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=timeout)
    if r.returncode != 0:
        raise SystemExit(f"failed ({r.returncode}): {' '.join(cmd)}\n{log.read_text()[-3000:]}")
    return round(time.monotonic() - t0, 2)


def du_bytes(path: Path) -> int:
    out = subprocess.run(["du", "-s", "--block-size=1", str(path)], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[0])


def packages(venv: Path) -> dict[str, str]:
    out = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "list", "--format", "json"],
                         capture_output=True, text=True, check=True)
    return {p["name"].lower(): p["version"] for p in json.loads(out.stdout)}


def pip_version(venv: Path) -> str:
    out = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "--version"], capture_output=True, text=True)
    return out.stdout.split()[1] if out.returncode == 0 else "?"


def what_came(venv: Path) -> dict:
    pkgs = packages(venv)
    size = du_bytes(venv)
    return {"size_bytes": size, "size_mb": round(size / 1e6, 1), "packages": len(pkgs),
            "heavy": {name: pkgs.get(name) for name in HEAVY},
            "nvidia_packages": sorted(n for n in pkgs if n.startswith("nvidia-")),
            "torch_installed": "torch" in pkgs}


def pip_install(venv: Path, log: Path, *args: str) -> float:
    return timed([str(venv / "bin" / "python"), "-m", "pip", "install", "--no-cache-dir", *args], log)


def new_venv(python: str, path: Path, log: Path) -> float:
    return timed([python, "-m", "venv", str(path)], log)


def client_part(python: str, src: Path, work: Path, log: Path) -> dict:
    venv = work / "client"
    out = {"venv_s": new_venv(python, venv, log), "pip": pip_version(venv)}
    out["command"] = "pip install --no-cache-dir ."
    out["install_s"] = pip_install(venv, log, str(src))
    out.update(what_came(venv))
    return out


def engine_part(python: str, src: Path, work: Path, log: Path, torch_version: str) -> dict:
    venv = work / "engine"
    out = {"venv_s": new_venv(python, venv, log), "pip": pip_version(venv)}
    out["command"] = f"pip install --no-cache-dir torch=={torch_version}; pip install --no-cache-dir '.[engine]'"
    out["torch_s"] = pip_install(venv, log, f"torch=={torch_version}")
    out["torch_build"] = packages(venv).get("torch")
    out["install_s"] = pip_install(venv, log, f"{src}[engine]")
    out["total_install_s"] = round(out["torch_s"] + out["install_s"], 2)
    out.update(what_came(venv))
    out["generate_s"] = timed([str(venv / "bin" / "slobench"), "generate", "hello", "--max-tokens", "4"], log, 300)
    return out


def rating_part(python: str, src: Path, work: Path, log: Path, extra: list[str]) -> dict:
    t0 = time.monotonic()
    venv = work / "rating"
    out = {"venv_s": new_venv(python, venv, log)}
    out["install_s"] = pip_install(venv, log, str(src))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    slobench = str(venv / "bin" / "slobench")
    t_mock = time.monotonic()
    with log.open("a") as f:
        mock = subprocess.Popen([slobench, "mock-server", "--port", str(port), *MOCK], stdout=f,
                                stderr=subprocess.STDOUT)
    try:
        wait_healthy(url, mock, 60)
        out["mock_start_s"] = round(time.monotonic() - t_mock, 2)
        cmd = [slobench, "capacity", "--target", url, *RATING, *extra, "--out", str(work / "capacity"),
               "--no-progress", "--no-report"]
        out["command"] = " ".join(["slobench", "capacity", "--target", "URL", *RATING, *extra])
        out["capacity_s"] = timed(cmd, log)
    finally:
        mock.terminate()
        mock.wait(10)
    out["total_s"] = round(time.monotonic() - t0, 2)
    summary = json.loads((work / "capacity" / "summary.json").read_text())
    rated = summary.get("rated_capacity") or {}
    out["mock"] = " ".join(MOCK)
    out["verdict"] = summary.get("verdict")
    out["rated_rps"] = rated.get("rate_rps")
    out["steps"] = len(summary.get("steps") or [])
    out["torch_installed"] = "torch" in packages(venv)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "install.json")
    ap.add_argument("--python", default="python3", help="the interpreter the virtualenvs are made from")
    ap.add_argument("--torch", default="2.13.0", help="the torch version installed before the engine extra")
    ap.add_argument("--skip", nargs="*", default=[], choices=("client", "engine", "rating"))
    ap.add_argument("--rating-arg", action="append", default=[], metavar="ARG",
                    help="one more argument for the rating's `slobench capacity` (repeatable)")
    args = ap.parse_args()
    python_version = subprocess.run([args.python, "--version"], capture_output=True, text=True).stdout.strip()
    pip_config = subprocess.run([args.python, "-m", "pip", "config", "list"], capture_output=True, text=True)
    doc: dict = {"bench": "install_bench", "when": now_iso(), "git_commit": git_commit(REPO), "machine": machine(),
                 "python": python_version, "pip_config": pip_config.stdout.strip().splitlines(),
                 "cache": "pip --no-cache-dir (no download cache)", "source": "git archive HEAD"}
    with tempfile.TemporaryDirectory(prefix="slobench-install-") as tmp:
        work = Path(tmp)
        src = work / "src"
        src.mkdir()
        archive = subprocess.run(["git", "archive", "HEAD"], cwd=REPO, capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
        log = work / "pip.log"
        parts = {"client": lambda: client_part(args.python, src, work, log),
                 "engine": lambda: engine_part(args.python, src, work, log, args.torch),
                 "rating": lambda: rating_part(args.python, src, work, log, args.rating_arg)}
        for name, run in parts.items():
            if name in args.skip:
                continue
            print(f"{name} ...", flush=True)
            doc[name] = run()
            print(f"{name}: {json.dumps(doc[name])}", flush=True)
            shutil.rmtree(work / name, ignore_errors=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
