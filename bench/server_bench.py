"""Server overhead and sustainable request rate of the reference engine's HTTP server.

    .venv/bin/python bench/server_bench.py                # both parts, tiny preset
    .venv/bin/python bench/server_bench.py --skip-rate    # only the added-latency part

1. Added TTFT at low load: one request at a time, alternating between in-process `Engine.generate` (TTFT
   from the engine's own timestamps: first token - add_request) and a streaming HTTP request to
   `python -m engine.server` in a subprocess (TTFT at the client: first content chunk - send). Medians
   side by side; the difference is what HTTP, JSON, SSE and the thread hand-offs add.
2. Highest sustained streaming rate: open-loop Poisson arrivals at increasing rates, each for
   `--duration` seconds. A rate is sustained when every request completes, the achieved rate
   (completions / time to the last completion) is within 10% of the rate actually sent and p90 TTFT
   stays under `--ttft-slo-ms`. The highest such rate is reported.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1]

from engine import Engine, EngineConfig, SamplingParams  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(port: int, extra: list[str]) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "engine.server", "--port", str(port), "--log-level", "warning", *extra]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
            return proc
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError(proc.stderr.read().decode()) from None
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("server did not become healthy")


def make_prompt(rng: random.Random, n_tokens: int) -> str:
    # The tiny preset's byte tokenizer: one token per ASCII character (plus BOS).
    words = ["load", "test", "token", "latency", "server", "queue", "batch", "prefill", "decode", "tier"]
    text = ""
    while len(text) < n_tokens - 1:
        text += rng.choice(words) + " "
    return text[: n_tokens - 1]


async def stream_one(session: aiohttp.ClientSession, url: str, body: dict, t_sched: float) -> dict:
    ttft = None
    n_chunks = 0
    status = 0
    try:
        async with session.post(url, json=body) as resp:
            status = resp.status
            async for line in resp.content:
                if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("choices") and chunk["choices"][0].get("text"):
                    n_chunks += 1
                    if ttft is None:
                        ttft = time.monotonic() - t_sched
    except aiohttp.ClientError as e:
        return {"ok": False, "error": str(e)}
    return {"ok": status == 200 and ttft is not None, "ttft": ttft, "done": time.monotonic(), "chunks": n_chunks}


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


async def added_latency(url: str, engine: Engine, n: int, prompt_tokens: int, max_tokens: int) -> dict:
    rng = random.Random(0)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    engine.generate(make_prompt(rng, prompt_tokens), params)  # warm-up
    inproc, http = [], []
    async with aiohttp.ClientSession() as session:
        for _ in range(3):  # warm-up
            body = {"prompt": make_prompt(rng, prompt_tokens), "max_tokens": max_tokens, "temperature": 0,
                    "ignore_eos": True, "stream": True}  # fmt: skip
            await stream_one(session, url, body, time.monotonic())
        for _ in range(n):
            prompt = make_prompt(rng, prompt_tokens)
            t = engine.generate(prompt, params)[0].timing
            inproc.append((t.first_token_time - t.arrival_time) * 1e3)
            body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True}
            r = await stream_one(session, url, body, time.monotonic())
            http.append(r["ttft"] * 1e3)
            await asyncio.sleep(0.02)
    return {
        "requests": n,
        "inproc_ttft_ms_median": statistics.median(inproc),
        "http_ttft_ms_median": statistics.median(http),
        "added_ttft_ms_median": statistics.median(http) - statistics.median(inproc),
        "inproc_ttft_ms_p90": pct(inproc, 90),
        "http_ttft_ms_p90": pct(http, 90),
    }


async def run_rate(url: str, rate: float, duration: float, prompt_tokens: int, max_tokens: int, seed: int) -> dict:
    rng = random.Random(seed)
    conn = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=duration + 60)
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as session:
        start = time.monotonic()
        t = 0.0
        tasks = []
        while True:
            t += rng.expovariate(rate)
            if t > duration:
                break
            delay = start + t - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            body = {"prompt": make_prompt(rng, prompt_tokens), "max_tokens": max_tokens, "ignore_eos": True,
                    "stream": True}  # fmt: skip
            tasks.append(asyncio.create_task(stream_one(session, url, body, start + t)))
        results = await asyncio.gather(*tasks)
    ok = [r for r in results if r["ok"]]
    end = max((r["done"] for r in ok), default=start)
    ttfts = [r["ttft"] * 1e3 for r in ok]
    return {
        "offered_rps": rate,
        "sent_rps": len(results) / duration,
        "sent": len(results),
        "completed": len(ok),
        "achieved_rps": len(ok) / (end - start) if ok else 0.0,
        "ttft_ms_p50": pct(ttfts, 50) if ttfts else None,
        "ttft_ms_p90": pct(ttfts, 90) if ttfts else None,
        "output_tok_s": sum(r["chunks"] for r in ok) / (end - start) if ok else 0.0,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--requests", type=int, default=40, help="sequential requests for the added-latency part")
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--rates", default="2,4,8,12,16,20,24,32,40,48,64")
    ap.add_argument("--duration", type=float, default=8.0, help="seconds of arrivals per rate")
    ap.add_argument("--ttft-slo-ms", type=float, default=1000.0)
    ap.add_argument("--skip-rate", action="store_true")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("server_args", nargs="*", help="extra engine.server flags (after --)")
    args = ap.parse_args()

    port = free_port()
    url = f"http://127.0.0.1:{port}/v1/completions"
    proc = start_server(port, ["--model", args.model, *args.server_args])
    out: dict = {"model": args.model, "prompt_tokens": args.prompt_tokens, "max_tokens": args.max_tokens,
                 "cpu_count": os.cpu_count()}  # fmt: skip
    try:
        engine = Engine(EngineConfig(model=args.model))
        lat = asyncio.run(added_latency(url, engine, args.requests, args.prompt_tokens, args.max_tokens))
        del engine
        out["added_latency"] = lat
        print(f"low load, {lat['requests']} sequential requests, {args.prompt_tokens}-token prompts:")
        print(
            f"  TTFT median  in-process Engine.generate {lat['inproc_ttft_ms_median']:7.2f} ms   "
            f"HTTP streaming {lat['http_ttft_ms_median']:7.2f} ms   added {lat['added_ttft_ms_median']:6.2f} ms"
        )
        print(f"  TTFT p90     in-process {lat['inproc_ttft_ms_p90']:7.2f} ms   HTTP {lat['http_ttft_ms_p90']:7.2f} ms")
        if not args.skip_rate:
            out["rates"] = []
            best = None
            print(
                f"open-loop Poisson, {args.duration:g} s per rate, {args.max_tokens} output tokens, "
                f"sustained = all complete, achieved >= 90% of sent, p90 TTFT <= {args.ttft_slo_ms:g} ms"
            )
            for i, rate in enumerate(float(r) for r in args.rates.split(",")):
                r = asyncio.run(run_rate(url, rate, args.duration, args.prompt_tokens, args.max_tokens, i))
                ok = (r["completed"] == r["sent"] and r["achieved_rps"] >= 0.9 * r["sent_rps"]
                      and r["ttft_ms_p90"] is not None and r["ttft_ms_p90"] <= args.ttft_slo_ms)  # fmt: skip
                r["sustained"] = ok
                out["rates"].append(r)
                print(
                    f"  {rate:6.1f} req/s offered: {r['completed']}/{r['sent']} done, {r['achieved_rps']:6.2f} "
                    f"req/s, TTFT p50 {r['ttft_ms_p50'] or 0:8.1f} ms p90 {r['ttft_ms_p90'] or 0:8.1f} ms, "
                    f"{r['output_tok_s']:7.1f} tok/s  {'ok' if ok else 'NOT sustained'}"
                )
                if not ok:
                    break
                best = rate
                time.sleep(1.0)
            out["max_sustained_rps"] = best
            print(f"highest sustained streaming rate: {best} req/s")
    finally:
        proc.terminate()
        proc.wait(30)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
