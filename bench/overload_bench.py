"""The reference engine far past its rated load: nothing lost, promises kept, goodput held (issue: the
engine under memory pressure).

Starts ``slobench serve --model tiny`` (the embedded engine, SLO-aware admission by default), rates it
with ``slobench capacity loadgen/scenarios/chat.yaml`` against that same server (unless ``--rated`` is given),
then sends chat.yaml's workload with a 10 % premium / 60 % standard / 30 % basic mix for ``--rated-s`` at
the rated load and for ``--overload-s`` at ``--factor`` x that load, and reports for each:

- lost requests: neither ok nor refused with 429 (a 500, a timeout, a dropped stream) — goal 0;
- p99 TTFT of the accepted premium and standard requests — goals <= 300 ms and <= 800 ms;
- goodput: requests per second of the tiers with a promise (premium, standard) that succeeded and met it
  — goal: at the overload, at least 90 % of the goodput at the rated load. Basic has no promise, so its
  requests are no evidence of goodput (``basic_served_rps`` counts them apart);
- 429s per tier, by kind, and their Retry-After; the server's RSS before and after, and its KV usage once
  idle (goal: back to 0);
- basic (no promise): its longest wait, to its first token or to its 429, within its bound (the engine's
  ``tier_max_queue_s``, 60 s by default).

    .venv/bin/python bench/overload_bench.py --json bench/results/overload.json
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

from loadgen.results import latency  # noqa: E402
from loadgen.results.records import read_records  # noqa: E402
from loadgen.target.embedded import EmbeddedEngine  # noqa: E402
from loadgen.target.scrape import scrape_once  # noqa: E402

PROMISE_MS = {"premium": 300.0, "standard": 800.0}
MAX_QUEUE_S = {"premium": 60.0, "standard": 60.0, "basic": 60.0}  # the engine's default tier_max_queue_s
MIX = {"premium": 1, "standard": 6, "basic": 3}
SCENARIO = """name: overload
workload:
  type: synthetic
  input_len: {{dist: lognormal, mean: 96, sigma: 0.5, min: 16, max: 512}}
  output_len: {{dist: uniform, min: 16, max: 48}}
  shared_prefix: {{num_prompts: 4, length: 64, ratio: 0.5}}
tiers:
  premium: {{weight: {premium}, slo: {{ttft_ms: 300}}}}
  standard: {{weight: {standard}, slo: {{ttft_ms: 800}}}}
  basic: {{weight: {basic}}}
load: {{arrival: poisson, rate: {rate}, duration_s: {duration}}}
client: {{lateness_bound_ms: 50}}
"""


def _rss_one(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def rss_kb(pid: int) -> int | None:
    """The server's resident memory: its front end and its engine-core process together."""
    total = _rss_one(pid) + sum(_rss_one(c) for c in _children(pid))
    return total or None


def idle_kv(url: str, timeout_s: float = 30.0) -> float | None:
    """KV usage once nothing is running or waiting (None when the page has no such gauge)."""
    deadline = time.monotonic() + timeout_s
    while True:
        m = scrape_once(url + "/metrics", ("vllm:",))
        busy = sum(v for k, v in m.items() if k.startswith(("vllm:num_requests_running", "vllm:num_requests_waiting")))
        kv = [v for k, v in m.items() if k.startswith("vllm:kv_cache_usage_perc")]
        if busy == 0 or time.monotonic() > deadline:
            return max(kv) if kv else None
        time.sleep(0.5)


def rate_it(url: str, out: Path) -> float:
    chat = REPO / "loadgen" / "scenarios" / "chat.yaml"
    r = subprocess.run([sys.executable, "-m", "loadgen.cli", "capacity", str(chat),
                        "--target", url, "--out", str(out), "--json", "--no-progress", "--no-report"],
                       cwd=REPO, capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        raise SystemExit(f"capacity run failed: {r.stderr[-2000:]}")
    rated = json.loads(r.stdout)["rated_capacity"]
    return float(rated["rate_rps"])


def ttft_parts(ok: list[dict]) -> dict:
    """p50 / p90 / p99 of each part of the accepted requests' TTFT: the engine's queue and prefill (its own
    timing), the steps its first text was held back after the first token (`held_ms`: the presets' byte
    tokenizer holds an incomplete UTF-8 character), the front end's own share (`front_end_ms`), and the rest
    outside the engine (front end, pipes, loopback, client)."""
    rows = [(s["queue_ms"], s["prefill_ms"], s.get("held_ms", 0.0), s.get("front_end_ms"), latency.ttft_ms(x))
            for x in ok if (s := x.get("server")) and s.get("queue_ms") is not None]
    parts = {"queue": [r[0] for r in rows], "prefill": [r[1] for r in rows], "held": [r[2] for r in rows],
             "front_end": [r[3] for r in rows if r[3] is not None],
             "outside_engine": [t - q - p - h for q, p, h, _, t in rows]}
    return {name: {f"p{k}": latency.percentile(v, k) for k in (50, 90, 99)} for name, v in parts.items()}


def rejections(rs: list[dict]) -> dict:
    """A tier's 429s: how many of each kind (the engine's code, read from its message), the Retry-After each
    carried (the message states the header's value), and the longest a client waited for one."""
    rejected = [x for x in rs if x["status"] == "rejected"]
    kinds: dict[str, int] = {}
    for x in rejected:
        text = x.get("error") or ""
        kind = ("queue_timeout" if "longest queue wait" in text else "shed_past_promise" if "held this request" in text
                else "queue_full" if "queue is full" in text else "slo_unattainable" if "would delay" in text
                else "other")
        kinds[kind] = kinds.get(kind, 0) + 1
    retry = [int(m.group(1)) for x in rejected if (m := re.search(r"retry in (\d+) s", x.get("error") or ""))]
    waits = [(x["done_s"] - x["scheduled_s"]) * 1e3 for x in rejected if x.get("done_s") is not None]
    return {"by_kind": kinds, "with_retry_after": len(retry),
            "retry_after_s": {"min": min(retry), "max": max(retry)} if retry else None,
            "longest_wait_to_429_ms": max(waits) if waits else None}


def load_run(url: str, rate: float, duration: float, out: Path) -> dict:
    scn = out.with_suffix(".yaml")
    scn.write_text(SCENARIO.format(rate=rate, duration=duration, **MIX))
    r = subprocess.run([sys.executable, "-m", "loadgen.cli", "run", str(scn), "--target", url, "--out", str(out),
                        "--no-progress", "--no-report", "--no-scrape", "--json"],
                       cwd=REPO, capture_output=True, text=True, timeout=duration + 600)
    recs = read_records(out / "requests.jsonl")
    span = max(r["scheduled_s"] for r in recs) - min(r["scheduled_s"] for r in recs) if recs else 0.0
    res: dict = {"rate_rps": rate, "duration_s": duration, "exit_code": r.returncode, "requests": len(recs),
                 "ok": sum(1 for x in recs if x["status"] == "ok"),
                 "rejected_429": sum(1 for x in recs if x["status"] == "rejected"),
                 "lost": sum(1 for x in recs if x["status"] not in ("ok", "rejected")),
                 "lost_statuses": sorted({f"{x['status']}:{x['http_status']}" for x in recs
                                          if x["status"] not in ("ok", "rejected")}),
                 "tiers": {}}
    good = 0
    for tier in MIX:
        rs = [x for x in recs if x["tier"] == tier]
        ok = [x for x in rs if x["status"] == "ok"]
        ttft = [latency.ttft_ms(x) for x in ok]
        promise = PROMISE_MS.get(tier)
        met = [x for x in ok if promise is not None and latency.ttft_ms(x) <= promise]
        good += len(met)
        res["tiers"][tier] = {"requests": len(rs), "accepted_ok": len(ok),
                              "rejected_429": sum(1 for x in rs if x["status"] == "rejected"),
                              "p50_ttft_ms": latency.percentile(ttft, 50), "p99_ttft_ms": latency.percentile(ttft, 99),
                              "max_ttft_ms": max(ttft) if ttft else None, "rejections": rejections(rs),
                              "promise_ms": promise, "met_promise": len(met), "ttft_parts_ms": ttft_parts(ok)}
    res["goodput_rps"] = good / span if span > 0 else None  # the promised tiers' requests that met it
    res["basic_served_rps"] = res["tiers"]["basic"]["accepted_ok"] / span if span > 0 else None
    retry = [x["error"] for x in recs if x["status"] == "rejected"][:3]
    res["rejection_examples"] = retry
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rated", type=float, help="the rated load in req/s (default: rate the server first)")
    ap.add_argument("--factor", type=float, default=10.0)
    ap.add_argument("--rated-s", type=float, default=30.0)
    ap.add_argument("--overload-s", type=float, default=60.0)
    ap.add_argument("--engine-opt", action="append", default=[], metavar="KEY=VALUE",
                    help="engine option (e.g. admission=queue-length for the baseline)")
    ap.add_argument("--workdir", type=Path, help="keep the run folders here (default: a temporary folder)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if args.rated is not None and args.rated <= 0:
        ap.error("--rated must be a positive request rate")
    opts = {"model": "tiny", "max_num_seqs": 64}
    for kv in args.engine_opt:
        k, _, v = kv.partition("=")
        opts[k] = v
    out: dict = {"engine": opts, "mix": MIX, "promises_ms": PROMISE_MS, "max_queue_s": MAX_QUEUE_S}
    with tempfile.TemporaryDirectory() as tmp:
        d = args.workdir or Path(tmp)
        d.mkdir(parents=True, exist_ok=True)
        engine = EmbeddedEngine(opts, log_path=Path(d) / "engine.log")
        url = engine.start()
        try:
            pid = engine.proc.pid
            out["rated_rps"] = args.rated or rate_it(url, Path(d) / "capacity")
            out["rated_from"] = "--rated" if args.rated else "slobench capacity chat (this server)"
            print(f"rated load {out['rated_rps']:.1f} req/s", flush=True)
            out["rss_kb_before"] = rss_kb(pid)
            out["at_rated"] = load_run(url, out["rated_rps"], args.rated_s, Path(d) / "rated")
            out["kv_after_rated"] = idle_kv(url)
            out["overload"] = load_run(url, args.factor * out["rated_rps"], args.overload_s, Path(d) / "overload")
            out["kv_after_overload"] = idle_kv(url)
            out["rss_kb_after"] = rss_kb(pid)
        finally:
            engine.stop()
    a, o = out["at_rated"], out["overload"]
    out["goodput_ratio"] = o["goodput_rps"] / a["goodput_rps"] if a["goodput_rps"] else None
    out["goals"] = {
        "nothing_lost": o["lost"] == 0 and a["lost"] == 0,
        "premium_p99_le_300": (o["tiers"]["premium"]["p99_ttft_ms"] or 0) <= 300,
        "standard_p99_le_800": (o["tiers"]["standard"]["p99_ttft_ms"] or 0) <= 800,
        "goodput_ge_90pct": out["goodput_ratio"] is not None and out["goodput_ratio"] >= 0.9,
        "kv_back_to_0": out["kv_after_overload"] in (0, 0.0),
        # basic has no promise: its longest wait, to a first token or to a 429, within its bound
        "basic_wait_within_bound": max(o["tiers"]["basic"]["max_ttft_ms"] or 0,
                                       o["tiers"]["basic"]["rejections"]["longest_wait_to_429_ms"] or 0)
        <= MAX_QUEUE_S["basic"] * 1e3,
        "every_429_has_retry_after": all(t["rejections"]["with_retry_after"] == t["rejected_429"]
                                         for r in (a, o) for t in r["tiers"].values()),
    }
    for name, r in (("rated", a), ("overload", o)):
        t = r["tiers"]
        print(f"{name:8s} {r['rate_rps']:6.1f} req/s: {r['requests']} requests, ok {r['ok']}, 429 {r['rejected_429']}, "
              f"lost {r['lost']}; p99 TTFT premium {t['premium']['p99_ttft_ms']} ms, standard "
              f"{t['standard']['p99_ttft_ms']} ms; goodput {r['goodput_rps']:.1f} req/s")
    print(f"goodput at overload / at rated: {out['goodput_ratio']:.2f}; RSS {out['rss_kb_before']} -> "
          f"{out['rss_kb_after']} kB; KV idle after: {out['kv_after_overload']}; goals {out['goals']}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
