"""slobench and GuideLLM side by side against the same real third-party server (`transformers serve`).

One run of this script builds the tiny random Llama of the test suite (tests/transformers_serve.py: a real
byte-level BPE tokenizer, nothing downloaded), starts ``transformers serve DIR --continuous-batching --device
cpu`` on it, pinned to ``--server-core``, and drives it at the same constant rate, request count, prompt length
and output length with both load generators, each pinned to ``--client-core`` (``taskset -c``): a warm-up run
of each tool (discarded), then slobench, GuideLLM, slobench, GuideLLM … (``--repeats`` of each, alternated).
It reports TTFT p50 and ITL p50 as each tool computes them, the ratio GuideLLM / slobench, whether they agree
within ``--tolerance`` (5 %), and like-for-like recomputations from both tools' per-request data that say why
when they do not.

    .venv/bin/python bench/third_party_bench.py --json bench/results/third-party.json

Definitions (what is compared with what):

- slobench (loadgen/results/latency.py): TTFT = first non-empty content chunk − *scheduled* send time (no
  coordinated omission); ITL (``median_itl_ms``) = every gap between consecutive content chunks, pooled over
  requests; TPOT (``median_tpot_ms``) = (last content chunk − first) / (usage completion_tokens − 1) per
  request. Quantiles are exact with linear interpolation.
- GuideLLM 0.8.1 (guidellm/schemas/base/request_stats.py, ``time_to_first_token_ms`` and
  ``inter_token_latency_ms``; timestamps from guidellm/backends/openai/http.py ``_resolve_streaming``):
  TTFT = first SSE line with non-empty text − ``request_start``, the moment httpx starts writing the request
  headers (the ``_trace_request_start`` hook), *not* the scheduled time (``targeted_start``); ITL = (last
  text line − first text line) / (usage completion_tokens − 1) per request, i.e. per token, not per chunk —
  slobench's TPOT formula. Its distributions (guidellm/benchmark/schemas/metrics.py) weight each request's ITL
  by output_tokens − 1, and its percentiles (guidellm/schemas/base/statistics.py ``Percentiles.from_pdf``) are
  the lower sample at the cumulative weight, without interpolation. Its own ``time_per_output_token_ms``
  includes the first token ((last − request_start) / tokens) and is *not* slobench's TPOT.

So the headline ITL comparison is GuideLLM's ITL against slobench's TPOT (both per token). slobench's chunk ITL
is reported beside it: transformers serve merges byte-level BPE pieces into one chunk (fewer chunks than
tokens), so gaps between chunks are longer than the time per token.

Fitting GuideLLM to this server: its synthetic data are given ``prompt_tokens`` only and the backend
``max_tokens``: with ``output_tokens`` in the data it sends ``ignore_eos: true``, which transformers serve
rejects (422). The checkpoint's EOS can never win the argmax, so answers are exactly max_tokens long anyway
(checked per request). It runs offline (HF_HUB_OFFLINE, TRANSFORMERS_OFFLINE), its tokenizer is the
checkpoint folder, and ``GUIDELLM__MAX_WORKER_PROCESSES`` is ``--guidellm-workers`` (GuideLLM's default is 10
processes; on one client core 1 is closer to slobench's single process). Every run's slice of the server log
is checked for HTTP errors (slobench's probe accounts for its own deliberate 4xx); the fields GuideLLM sent are
read from its per-request records (model, prompt, max_tokens, stream, stream_options: transformers serve
ignores stream_options, and logs that only once per process, and sends usage in the final chunk regardless).

Numbers depend on the machine being quiet: the JSON records the load average before and after.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

from loadgen.results import latency  # noqa: E402
from loadgen.results.records import read_records  # noqa: E402
from loadgen.results.runmeta import git_commit  # noqa: E402

GUIDELLM_DEFAULT = "/tmp/gl/bin/guidellm"
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
# Where each tool's definitions live (cited in the JSON and the docstring).
DEFINITIONS = {
    "slobench": {
        "source": "loadgen/results/latency.py (ttft_ms, itl_ms, tpot_ms, quantile)",
        "ttft": "first non-empty content chunk - scheduled send time",
        "itl": "every gap between consecutive content chunks, pooled (median_itl_ms)",
        "tpot": "(last content chunk - first) / (usage completion_tokens - 1), per request (median_tpot_ms)",
        "quantile": "exact, linear interpolation",
    },
    "guidellm": {
        "source": "guidellm/schemas/base/request_stats.py (time_to_first_token_ms, inter_token_latency_ms); "
                  "timestamps: guidellm/backends/openai/http.py (_resolve_streaming, _trace_request_start); "
                  "distributions: guidellm/benchmark/schemas/metrics.py; "
                  "percentiles: guidellm/schemas/base/statistics.py (Percentiles.from_pdf)",
        "ttft": "first SSE line with non-empty text - request_start (httpx starts writing the request headers)",
        "itl": "(last text line - first text line) / (usage completion_tokens - 1), per request: per token",
        "tpot": "(last text line - request_start) / completion_tokens (includes the first token; not slobench's)",
        "quantile": "weighted (ITL by output_tokens - 1), lower sample at the cumulative weight, no interpolation",
    },
}


class BenchError(RuntimeError):
    """A setup or run failure with a message meant for the person running the bench."""


# ------------------------------------------------------------------ processes


def kill_group(proc: subprocess.Popen, grace_s: float = 5) -> None:
    """Stop a process started with start_new_session=True and everything in its group (ours only)."""
    if proc.poll() is not None:
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(grace_s)
            return
        except subprocess.TimeoutExpired:
            continue


def run_logged(cmd: list[str], *, name: str, log: Path, timeout_s: float, env: dict[str, str] | None = None,
               cwd: Path | None = None) -> float:
    """Run cmd with stdout+stderr into log; its wall time; BenchError with the log's tail on failure."""
    t0 = time.monotonic()
    with open(log, "wb") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=True)
        try:
            rc = proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            kill_group(proc)
            raise BenchError(f"{name} ran past {timeout_s:.0f} s; log: {log}\n{tail(log)}") from None
        finally:
            kill_group(proc)  # nothing of it outlives the call, a Ctrl-C included
    if rc != 0:
        raise BenchError(f"exit status {rc}: {' '.join(cmd)}\nlog: {log}\n{tail(log)}")
    return time.monotonic() - t0


def tail(path: Path, n: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def session_tasks(sid: int) -> dict[int, list[int]]:
    """pid -> thread ids of every process in session sid (TransformersServe starts its own session)."""
    out: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            fields = stat[stat.rindex(")") + 2:].split()
            if int(fields[3]) == sid:  # state ppid pgrp session ...
                out[int(d.name)] = [int(t.name) for t in (d / "task").iterdir()]
        except (OSError, ValueError, IndexError):
            continue
    return out


def pin_session(sid: int, core: int) -> dict[str, Any]:
    """Pin every thread of the server's processes to core and read back what each allows."""
    allowed: set[str] = set()
    threads = 0
    for pid, tids in session_tasks(sid).items():
        for tid in tids:
            try:
                os.sched_setaffinity(tid, {core})
                status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
                allowed.add(re.search(r"Cpus_allowed_list:\s*(\S+)", status).group(1))
                threads += 1
            except (OSError, AttributeError):
                continue
    return {"core": core, "threads": threads, "cpus_allowed": sorted(allowed)}


def log_slice(log: Path, start: int) -> tuple[str, int]:
    data = log.read_bytes()
    return data[start:].decode(errors="replace"), len(data)


def server_log_findings(text: str) -> dict[str, Any]:
    """HTTP statuses of generation requests and the fields the server said it ignored or rejected."""
    statuses: dict[str, int] = {}
    for m in re.finditer(r'"POST (/v1/\S+) HTTP/[\d.]+" (\d{3})', text):
        key = f"{m.group(1)} {m.group(2)}"
        statuses[key] = statuses.get(key, 0) + 1
    ignored = sorted(set(re.findall(r"Ignoring unsupported fields in the request: (\{.*?\})", text)))
    rejected = sorted(set(re.findall(r"Unexpected fields in the request: (\{.*?\})", text)))
    return {"statuses": statuses, "ignored_fields": ignored, "rejected_fields": rejected,
            "errors": sum(n for k, n in statuses.items() if not k.endswith(" 200"))}


# ------------------------------------------------------------------ the two tools


def slobench_cli() -> list[str]:
    exe = Path(sys.executable).with_name("slobench")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "loadgen.cli"]


def write_scenario(path: Path, args, requests: int) -> Path:
    path.write_text(
        "# written by bench/third_party_bench.py: constant arrivals, fixed lengths, no tiers\n"
        "name: third-party\nseed: 0\n"
        f"workload:\n  type: synthetic\n  input_len: {args.input_len}\n  output_len: {args.output_len}\n"
        f"load:\n  arrival: constant\n  rate: {args.rate:g}\n  requests: {requests}\n")
    return path


def run_slobench(server, ckpt: Path, out: Path, args, requests: int) -> dict[str, Any]:
    out.mkdir(parents=True)
    scenario = write_scenario(out / "scenario.yaml", args, requests)
    run_dir = out / "run"
    # --no-scrape: transformers serve has no /metrics (the probe would find none; this spares the process).
    cmd = ["taskset", "-c", str(args.client_core), *slobench_cli(), "run", str(scenario), "--target", server.url,
           "--model", server.model, "--tokenizer", str(ckpt), "--out", str(run_dir), "--no-progress",
           "--no-report", "--no-scrape", "--json"]
    env = {**os.environ, **OFFLINE}
    wall = run_logged(cmd, name="slobench", log=out / "slobench.log", timeout_s=run_timeout(args, requests),
                      env=env, cwd=REPO)
    s = json.loads((run_dir / "summary.json").read_text())
    recs = [r for r in read_records(run_dir / "requests.jsonl") if latency.succeeded(r)]
    from_send = [latency.ttft_ms(r) - latency.lateness_ms(r) for r in recs if latency.ttft_ms(r) is not None]
    last_from_send = [latency.e2el_ms(r) - latency.lateness_ms(r) for r in recs if latency.e2el_ms(r) is not None]
    lat = s.get("client_lateness") or {}
    return {
        "tool": "slobench", "command": cmd, "wall_s": wall, "requests": s.get("requests"),
        "completed": s.get("completed"), "failed": s.get("failed"), "valid": s.get("valid"),
        "invalid_reason": s.get("invalid_reason"),
        "ttft_p50_ms": s.get("median_ttft_ms"),
        "itl_p50_ms": s.get("median_itl_ms"),
        "tpot_p50_ms": s.get("median_tpot_ms"),
        "ttft_from_send_p50_ms": latency.percentile(from_send, 50),
        "last_from_send_p50_ms": latency.percentile(last_from_send, 50),
        "send_delay_p50_ms": lat.get("p50_ms"), "send_delay_p99_ms": lat.get("p99_ms"),
        "output_tokens": sorted({latency.output_tokens(r) for r in recs}),
        "prompt_tokens_p50": latency.percentile([r["prompt_tokens"] for r in recs if r.get("prompt_tokens")], 50),
        "chunks_per_request_p50": latency.percentile([len(r["token_s"]) for r in recs], 50),
        "request_fit": (s.get("request_fit") or {}).get("shape"),
        "probe_rejections": sorted(((s.get("target_probe") or {}).get("rejections") or {}).keys()),
        "run_dir": str(run_dir),
    }


def guidellm_version(exe: str) -> str:
    """`guidellm --version` prints "guidellm version: 0.8.1"; anything else is not GuideLLM."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    try:
        p = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=120, env=env)
    except (OSError, subprocess.SubprocessError) as e:
        raise BenchError(f"cannot run GuideLLM at {exe}: {e}") from e
    m = re.search(r"guidellm version:\s*(\S+)", p.stdout)
    if p.returncode != 0 or not m:
        raise BenchError(f"{exe} --version did not answer like GuideLLM (exit {p.returncode}): "
                         f"{(p.stdout + p.stderr).strip()[:300]!r}; pass --guidellm PATH")
    return m.group(1)


def arg_string(**kv: Any) -> str:
    """GuideLLM 0.8's `kind=…,key=value` option syntax (guidellm/utils/arg_string.py: split on commas)."""
    for k, v in kv.items():
        if "," in str(v):
            raise BenchError(f"GuideLLM option value {k}={v!r} contains a comma, which its arg strings cannot hold")
    return ",".join(f"{k}={v}" for k, v in kv.items())


def run_guidellm(server, ckpt: Path, out: Path, args, requests: int) -> dict[str, Any]:
    out.mkdir(parents=True)
    result = out / "benchmarks.json"
    # No output_tokens in the data: with it GuideLLM sends ignore_eos (a 422 here); max_tokens on the backend.
    cmd = ["taskset", "-c", str(args.client_core), args.guidellm, "run",
           "--backend", arg_string(kind="openai_http", target=server.url, model=server.model,
                                   request_format="/v1/completions", max_tokens=args.output_len),
           "--profile", arg_string(kind="constant", rate=f"{args.rate:g}"),
           "--constraint", arg_string(kind="max_requests", count=requests),
           "--data", arg_string(kind="synthetic_text", prompt_tokens=args.input_len),
           "--tokenizer", arg_string(kind="huggingface_auto", model=ckpt),
           "--output", arg_string(kind="json", path=result),
           "--disable-console-interactive"]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env.update(OFFLINE, GUIDELLM__MAX_WORKER_PROCESSES=str(args.guidellm_workers))
    # cwd: GuideLLM may write guidellm.log into its working directory.
    wall = run_logged(cmd, name="guidellm", log=out / "guidellm.log", timeout_s=run_timeout(args, requests),
                      env=env, cwd=out)
    if not result.exists():
        raise BenchError(f"GuideLLM wrote no {result}; log: {out / 'guidellm.log'}\n{tail(out / 'guidellm.log')}")
    doc = json.loads(result.read_text())
    benches = doc.get("benchmarks") or []
    if len(benches) != 1:
        raise BenchError(f"expected one benchmark in {result}, found {len(benches)}")
    b = benches[0]
    m = b["metrics"]

    def own_p50(name: str) -> float | None:
        return ((m.get(name) or {}).get("successful") or {}).get("percentiles", {}).get("p50")

    ok = (b.get("requests") or {}).get("successful") or []
    ttft_targeted, ttft_own, itl, dispatch, out_tokens, prompt_tokens, chunks = [], [], [], [], [], [], []
    last_from_send: list[float] = []
    body_fields: set[str] = set()
    for r in ok:
        t = r["info"]["timings"]
        first, last, start, targeted = (t.get("first_token_iteration"), t.get("last_token_iteration"),
                                        t.get("request_start"), t.get("targeted_start"))
        n_out = (r.get("output_metrics") or {}).get("text_tokens")
        out_tokens.append(n_out)
        prompt_tokens.append((r.get("input_metrics") or {}).get("text_tokens"))
        chunks.append(t.get("token_iterations"))
        if first is not None and targeted is not None:
            ttft_targeted.append((first - targeted) * 1000)
        if first is not None and start is not None:
            ttft_own.append((first - start) * 1000)
        if last is not None and start is not None:
            last_from_send.append((last - start) * 1000)
        if start is not None and targeted is not None:
            dispatch.append((start - targeted) * 1000)
        if first is not None and last is not None and n_out and n_out > 1:
            itl.append((last - first) * 1000 / (n_out - 1))
        with contextlib.suppress(KeyError, TypeError, ValueError):
            body_fields |= set(json.loads(r["request_args"])["body"])
    totals = m.get("request_totals") or {}
    return {
        "tool": "guidellm", "command": cmd, "wall_s": wall, "requests": totals.get("total"),
        "completed": totals.get("successful"), "failed": (totals.get("errored") or 0) + (totals.get("incomplete") or 0),
        "ttft_p50_ms": own_p50("time_to_first_token_ms"),
        "itl_p50_ms": own_p50("inter_token_latency_ms"),
        "tpot_incl_first_p50_ms": own_p50("time_per_output_token_ms"),
        # the same per-request values with slobench's quantile (linear interpolation):
        "ttft_linear_p50_ms": latency.percentile(ttft_own, 50),
        "itl_linear_p50_ms": latency.percentile(itl, 50),
        # TTFT from the scheduled time, slobench's start point:
        "ttft_from_targeted_p50_ms": latency.percentile(ttft_targeted, 50),
        "last_from_send_p50_ms": latency.percentile(last_from_send, 50),
        "send_delay_p50_ms": latency.percentile(dispatch, 50), "send_delay_p99_ms": latency.percentile(dispatch, 99),
        "output_tokens": sorted({n for n in out_tokens if n is not None}),
        "prompt_tokens_p50": latency.percentile([n for n in prompt_tokens if n], 50),
        "chunks_per_request_p50": latency.percentile([c for c in chunks if c is not None], 50),
        "per_request_records": len(ok),
        "body_fields": sorted(body_fields),
        "result_json": str(result),
    }


def run_timeout(args, requests: int) -> float:
    return requests / args.rate + args.startup_timeout


# ------------------------------------------------------------------ comparison


def ratio(g: float | None, s: float | None) -> float | None:
    return None if g is None or s is None or s == 0 else g / s


def compare_row(name: str, g: float | None, s: float | None, tol: float, note: str) -> dict[str, Any]:
    r = ratio(g, s)
    return {"what": name, "guidellm_ms": g, "slobench_ms": s, "ratio": r,
            "within": None if r is None else abs(r - 1) <= tol, "note": note}


def median_of(runs: list[dict], key: str) -> float | None:
    vals = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(vals) if vals else None


def spread_pct(runs: list[dict], key: str) -> float | None:
    """(max − min) / median of the per-run values, in percent: the run-to-run noise of one tool."""
    vals = [r[key] for r in runs if r.get(key) is not None]
    if len(vals) < 2 or not statistics.median(vals):
        return None
    return 100 * (max(vals) - min(vals)) / statistics.median(vals)


def compare(sb: list[dict], gl: list[dict], tol: float) -> dict[str, Any]:
    S = {k: median_of(sb, k) for k in ("ttft_p50_ms", "itl_p50_ms", "tpot_p50_ms", "ttft_from_send_p50_ms",
                                       "last_from_send_p50_ms", "send_delay_p50_ms", "chunks_per_request_p50")}
    G = {k: median_of(gl, k) for k in ("ttft_p50_ms", "itl_p50_ms", "ttft_linear_p50_ms", "itl_linear_p50_ms",
                                       "ttft_from_targeted_p50_ms", "last_from_send_p50_ms", "send_delay_p50_ms",
                                       "chunks_per_request_p50", "tpot_incl_first_p50_ms")}
    pct = int(round(tol * 100))
    headline = {
        "ttft": compare_row("TTFT p50, each tool's own figure", G["ttft_p50_ms"], S["ttft_p50_ms"], tol,
                            "GuideLLM from its request send (headers written), slobench from the scheduled time"),
        "itl": compare_row("ITL p50 per token: GuideLLM inter_token_latency vs slobench median_tpot",
                           G["itl_p50_ms"], S["tpot_p50_ms"], tol,
                           "both (last content chunk - first) / (usage tokens - 1) per request"),
    }
    like = {
        "ttft_from_scheduled": compare_row("TTFT p50 from the scheduled time (GuideLLM targeted_start)",
                                           G["ttft_from_targeted_p50_ms"], S["ttft_p50_ms"], tol,
                                           "recomputed from GuideLLM's per-request timings, linear quantile"),
        "ttft_from_send": compare_row("TTFT p50 from the send (slobench sent_s, GuideLLM request_start)",
                                      G["ttft_linear_p50_ms"], S["ttft_from_send_p50_ms"], tol,
                                      "recomputed from both tools' per-request data, linear quantile"),
        "last_from_send": compare_row("last content chunk p50 from the send", G["last_from_send_p50_ms"],
                                      S["last_from_send_p50_ms"], tol,
                                      "where the answer ends: with TTFT from the send, splits a TTFT or ITL gap"),
        "itl_per_token_linear": compare_row("per-token ITL p50, both with linear interpolation",
                                            G["itl_linear_p50_ms"], S["tpot_p50_ms"], tol,
                                            "GuideLLM's per-request ITL with slobench's quantile"),
        "itl_each_own": compare_row("ITL p50, each tool's own (GuideLLM per token, slobench per chunk)",
                                    G["itl_p50_ms"], S["itl_p50_ms"], tol,
                                    "not like with like: slobench's ITL pools gaps between content chunks"),
    }
    spread = {tool: {k: spread_pct(runs, k) for k in ("ttft_p50_ms", "itl_p50_ms", "tpot_p50_ms") if runs
                     and any(k in r for r in runs)} for tool, runs in (("slobench", sb), ("guidellm", gl))}
    reasons = {"ttft": ttft_reason(headline["ttft"], like, S, G, spread, pct),
               "itl": itl_reason(headline["itl"], like, S, G, spread, pct)}
    return {"medians": {"slobench": S, "guidellm": G}, "headline": headline, "like_for_like": like,
            "run_to_run_spread_pct": spread,
            "within_5pct": {k: v["within"] for k, v in headline.items()},
            "reasons": reasons}


def fmt(x: float | None, unit: str = " ms") -> str:
    return "n/a" if x is None else f"{x:.3f}{unit}"


def noise_note(spread: dict, key_s: str, key_g: str, r: float | None) -> str:
    ss, sg = spread["slobench"].get(key_s), spread["guidellm"].get(key_g)
    if r is None or (ss is None and sg is None):
        return ""
    noise = max(x for x in (ss, sg) if x is not None)
    diff = abs(r - 1) * 100
    side = "within" if diff <= noise else "beyond"
    return f" The {diff:.1f} % difference is {side} the run-to-run spread of one tool ({noise:.1f} %)."


def ttft_reason(row: dict, like: dict, S: dict, G: dict, spread: dict, pct: int) -> str:
    start = (f"GuideLLM starts TTFT when httpx writes the request headers (request_start), slobench at the "
             f"scheduled send time; their send delays (p50) are {fmt(G['send_delay_p50_ms'])} (GuideLLM, "
             f"targeted_start -> request_start) and {fmt(S['send_delay_p50_ms'])} (slobench, scheduled_s -> sent_s).")
    if row["within"] is None:
        return "no value to compare"
    fs, fsch = like["ttft_from_send"], like["ttft_from_scheduled"]
    if row["within"]:
        return f"agree within {pct} %. " + start
    if fs["within"] and not fsch["within"]:
        why = (f"Measured from the send both agree (ratio {fs['ratio']:.3f}): the difference is where TTFT starts "
               "(a definition), GuideLLM's own dispatch delay is not in its TTFT.")
    elif fsch["within"]:
        why = (f"Measured from the scheduled time both agree (ratio {fsch['ratio']:.3f}): GuideLLM's own TTFT "
               "leaves out the time its scheduler and worker took to send.")
    else:
        why = ("They differ from either start point, so the rest is client overhead between the socket and the "
               "parsed chunk (httpx in GuideLLM's worker process vs aiohttp on uvloop), the prompts' text "
               "(Faker words vs slobench's exact-length text, same token count) or run-to-run variance.")
    return why + " " + start + noise_note(spread, "ttft_p50_ms", "ttft_p50_ms", row["ratio"])


def itl_reason(row: dict, like: dict, S: dict, G: dict, spread: dict, pct: int) -> str:
    chunks = (f"transformers serve sent a median {fmt(S['chunks_per_request_p50'], '')} content chunks per answer "
              f"(GuideLLM saw {fmt(G['chunks_per_request_p50'], '')}): it merges byte-level pieces, so slobench's "
              f"chunk ITL ({fmt(S['itl_p50_ms'])}) is not a per-token figure and is compared only for information "
              f"(ratio {fmt(like['itl_each_own']['ratio'], '')}).")
    if row["within"] is None:
        return "no value to compare. " + chunks
    if row["within"]:
        return f"agree within {pct} % (GuideLLM ITL and slobench TPOT are the same per-token formula). " + chunks
    lin, last, first = like["itl_per_token_linear"], like["last_from_send"], like["ttft_from_send"]
    if last["within"] and not first["within"]:
        why = (f"The last chunk arrives at the same time after the send in both (ratio {last['ratio']:.3f}) but the "
               f"first does not (ratio {first['ratio']:.3f}): one tool sees the first chunk later, which shortens "
               "its first-to-last span and so its per-token time.")
    elif lin["within"]:
        why = (f"With the same quantile method they agree (ratio {lin['ratio']:.3f}): GuideLLM's percentile takes "
               "the lower sample without interpolation.")
    else:
        why = ("Same formula, same quantile method, still apart: client time to read and parse each chunk (the "
               "timestamps are taken after parsing, in each tool's event loop) or run-to-run variance.")
    return why + " " + chunks + noise_note(spread, "tpot_p50_ms", "itl_p50_ms", row["ratio"])


# ------------------------------------------------------------------ main


def check_setup(args) -> None:
    exe = shutil.which(args.guidellm) or (args.guidellm if os.access(args.guidellm, os.X_OK) else None)
    if not exe:
        raise BenchError(f"GuideLLM not found at {args.guidellm}: install it in its own venv "
                         "(python -m venv /tmp/gl && /tmp/gl/bin/pip install guidellm==0.8.1) or pass --guidellm PATH")
    args.guidellm = str(Path(exe).resolve()) if "/" in exe else exe
    if not shutil.which("taskset"):
        raise BenchError("taskset (util-linux) not found: it pins the load generators to --client-core")
    cores = os.sched_getaffinity(0)
    if args.server_core == args.client_core or not {args.server_core, args.client_core} <= cores:
        raise BenchError(f"--server-core {args.server_core} and --client-core {args.client_core} must be two different "
                         f"cores this process may use ({sorted(cores)})")
    for mod in ("fastapi", "uvicorn"):
        try:
            __import__(mod)
        except ImportError:
            raise BenchError("transformers serve needs `pip install 'transformers[serving]'` in this venv "
                             f"({mod} is missing)") from None


def print_table(runs: list[dict], cmp: dict) -> None:
    print("\nper run (ms)                 TTFT p50   ITL p50   TPOT p50   chunks  out tokens  send delay p50")
    for r in runs:
        tpot = r.get("tpot_p50_ms")
        print(f"  {r['label']:<25} {fmt(r['ttft_p50_ms'], ''):>9} {fmt(r['itl_p50_ms'], ''):>9} "
              f"{fmt(tpot, '') if tpot is not None else '-':>10} {fmt(r['chunks_per_request_p50'], ''):>8}"
              f"  {str(r['output_tokens']):>10} {fmt(r['send_delay_p50_ms'], ''):>12}")
    print("  (GuideLLM ITL is per token; slobench ITL is per chunk, its TPOT per token)")
    print(f"\n{'comparison (medians of runs)':<72} {'GuideLLM':>9} {'slobench':>9} {'ratio':>7}  agree")
    rows = [*cmp["headline"].values(), *cmp["like_for_like"].values()]
    for i, row in enumerate(rows):
        if i == 2:
            print("  like for like:")
        flag = {True: "yes", False: "NO", None: "-"}[row["within"]]
        print(f"  {row['what']:<70} {fmt(row['guidellm_ms'], ''):>9} {fmt(row['slobench_ms'], ''):>9} "
              f"{fmt(row['ratio'], ''):>7}  {flag}")
    print(f"\nwithin 5 %: TTFT {cmp['within_5pct']['ttft']}, ITL {cmp['within_5pct']['itl']}")
    for k, v in cmp["reasons"].items():
        print(f"  {k}: {v}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=2.0, help="constant arrivals, requests per second")
    ap.add_argument("--requests", type=int, default=40, help="requests per measured run")
    ap.add_argument("--input-len", type=int, default=128, help="prompt tokens (as the server counts them)")
    ap.add_argument("--output-len", type=int, default=32, help="output tokens (max_tokens)")
    ap.add_argument("--repeats", type=int, default=2, help="measured runs of each tool, alternated")
    ap.add_argument("--warmup-requests", type=int, default=10, help="requests of each tool's discarded warm-up run")
    ap.add_argument("--tolerance", type=float, default=0.05, help="agreement bound on |ratio - 1|")
    ap.add_argument("--guidellm", default=GUIDELLM_DEFAULT, help="the guidellm executable (its own venv)")
    ap.add_argument("--guidellm-workers", type=int, default=1,
                    help="GUIDELLM__MAX_WORKER_PROCESSES (GuideLLM's default is 10)")
    ap.add_argument("--server-core", type=int, default=0)
    ap.add_argument("--client-core", type=int, default=1, help="both load generators, one at a time")
    ap.add_argument("--startup-timeout", type=float, default=300.0, help="seconds a run may take beyond its arrivals")
    ap.add_argument("--workdir", type=Path, help="keep the checkpoint, logs and both tools' outputs here")
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args()
    if args.rate <= 0 or args.requests < 2 or args.repeats < 1 or args.output_len < 2 or args.input_len < 2:
        ap.error("need --rate > 0, --requests >= 2, --repeats >= 1, --input-len and --output-len >= 2")
    # SIGTERM unwinds like Ctrl-C, so the server is stopped in bench()'s finally block either way.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        check_setup(args)
        return bench(args)
    except BenchError as e:
        print(f"third_party_bench: {e}", file=sys.stderr)
        if args.workdir is None and getattr(args, "work", None):
            print(f"third_party_bench: outputs kept for inspection in {args.work}", file=sys.stderr)
        return 2


def bench(args) -> int:
    from tests.transformers_serve import TransformersServe, make_serve_checkpoint

    gl_version = guidellm_version(args.guidellm)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="third-party-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    args.work = work
    load_before = os.getloadavg()
    ckpt = make_serve_checkpoint(work / "checkpoint")
    own = os.sched_getaffinity(0)
    server = None
    runs: list[dict[str, Any]] = []
    try:
        # TransformersServe offers no hook into its Popen: the server inherits this process's affinity, and every
        # thread of its session is pinned again once it is up (threads started before a later setaffinity keep
        # theirs).
        os.sched_setaffinity(0, {args.server_core})
        try:
            server = TransformersServe(ckpt, work / "transformers-serve.log", timeout_s=args.startup_timeout)
        finally:
            os.sched_setaffinity(0, {args.client_core})  # this process waits beside the load generators
        pinned = pin_session(server.proc.pid, args.server_core)
        if pinned["cpus_allowed"] != [str(args.server_core)]:
            raise BenchError(f"could not pin transformers serve to core {args.server_core}: {pinned}")
        print(f"transformers serve {server.url} (up in {server.start_s:.1f} s), pinned to core {args.server_core} "
              f"({pinned['threads']} threads); load generators on core {args.client_core}; GuideLLM {gl_version}",
              flush=True)
        _, offset = log_slice(server.log, 0)
        plan = [("warm-up", "slobench", args.warmup_requests), ("warm-up", "guidellm", args.warmup_requests)]
        for i in range(args.repeats):
            plan += [(f"run {i + 1}", "slobench", args.requests), (f"run {i + 1}", "guidellm", args.requests)]
        for n, (phase, tool, requests) in enumerate(plan):
            out = work / "runs" / f"{n:02d}-{tool}-{phase.replace(' ', '')}"
            fn = run_slobench if tool == "slobench" else run_guidellm
            r = fn(server, ckpt, out, args, requests)
            text, offset = log_slice(server.log, offset)
            r.update(label=f"{tool} {phase}", phase=phase, server_log=server_log_findings(text))
            if server.proc.poll() is not None:
                raise BenchError(f"transformers serve exited during {r['label']}; log: {server.log}\n"
                                 f"{tail(server.log)}")
            check_run(r, args, requests)
            runs.append(r)
            print(f"{r['label']:<20} {r['completed']}/{requests} ok  TTFT p50 {fmt(r['ttft_p50_ms'])}  "
                  f"ITL p50 {fmt(r['itl_p50_ms'])}"
                  + (f"  TPOT p50 {fmt(r['tpot_p50_ms'])}" if tool == "slobench" else "  (per token)")
                  + f"  [{r['wall_s']:.0f} s]", flush=True)
    finally:
        if server is not None:
            server.stop()
        os.sched_setaffinity(0, own)
    measured = [r for r in runs if r["phase"] != "warm-up"]
    cmp = compare([r for r in measured if r["tool"] == "slobench"], [r for r in measured if r["tool"] == "guidellm"],
                  args.tolerance)
    print_table(measured, cmp)
    result = {
        "bench": "third_party_bench",
        "question": "do slobench and GuideLLM report the same TTFT p50 and ITL p50 against the same real server?",
        "server": {"name": "transformers serve --continuous-batching --device cpu", "checkpoint":
                   "tests/transformers_serve.py make_serve_checkpoint (tiny random Llama, trained BPE tokenizer)",
                   "core": args.server_core, "threads_pinned": pinned["threads"], "start_s": server.start_s},
        "config": {"rate_rps": args.rate, "requests": args.requests, "input_len": args.input_len,
                   "output_len": args.output_len, "repeats": args.repeats, "warmup_requests": args.warmup_requests,
                   "tolerance": args.tolerance, "client_core": args.client_core,
                   "guidellm_workers": args.guidellm_workers, "order": [f"{t} {p}" for p, t, _ in plan]},
        "versions": {"guidellm": gl_version, "transformers": _dist_version("transformers"),
                     "slobench_git_commit": git_commit()},
        "machine": {"cpus": os.cpu_count(), "loadavg_before": load_before, "loadavg_after": os.getloadavg()},
        "definitions": DEFINITIONS,
        "fitting_guidellm": [
            "synthetic_text with prompt_tokens only and backend max_tokens: output_tokens in the data makes "
            "GuideLLM send ignore_eos, which transformers serve rejects with 422",
            "GuideLLM sends stream_options {include_usage, continuous_usage_stats}; transformers serve ignores "
            "stream_options (a log line) and sends usage in the final chunk anyway; streams end without [DONE], "
            "which GuideLLM handles by the end of the response; the ignored field is logged once per server "
            "process (warning_once), so the fields sent are read from GuideLLM's request_args (body_fields)",
            "HF_HUB_OFFLINE=1, TRANSFORMERS_OFFLINE=1; tokenizer = the checkpoint folder",
        ],
        "runs": runs,
        "comparison": cmp,
        "workdir": str(work) if args.workdir else None,
    }
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
        print(f"\nwrote {args.json}")
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def check_run(r: dict, args, requests: int) -> None:
    """A run that did not do what was asked is an error, not a number."""
    problems = []
    if r["completed"] != requests or r["failed"]:
        problems.append(f"{r['completed']}/{requests} requests succeeded, {r['failed']} failed")
    if r["output_tokens"] != [args.output_len]:
        problems.append(f"output lengths {r['output_tokens']}, expected all {args.output_len}")
    if r["prompt_tokens_p50"] is not None and abs(r["prompt_tokens_p50"] - args.input_len) > 0.02 * args.input_len:
        problems.append(f"server counted a median {r['prompt_tokens_p50']} prompt tokens, expected {args.input_len}")
    log = r["server_log"]
    if r["tool"] == "guidellm":
        if log["errors"] or log["rejected_fields"]:
            problems.append(f"the server answered GuideLLM with errors: {log}")
        if r["per_request_records"] != requests:
            problems.append(f"GuideLLM kept {r['per_request_records']} per-request records of {requests}")
    else:
        # slobench's probe sends one request per optional field on purpose; those 4xx are expected, nothing else.
        expected = len(r["probe_rejections"])
        if log["errors"] > expected:
            problems.append(f"{log['errors']} error answers in the server log, the probe accounts for {expected}")
        if r["valid"] is False:
            problems.append(f"slobench marked the run invalid: {r['invalid_reason']}")
    if problems:
        raise BenchError(f"{r['label']}: " + "; ".join(problems))


def _dist_version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


if __name__ == "__main__":
    sys.exit(main())
