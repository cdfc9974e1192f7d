"""Chunked prefill: the largest inter-token gap of running decodes while a long prompt is prefilled, with
and without chunking, and the extra time the long prompt takes.

The engine ranks requests by (tier, arrival) and gives a step's token budget in that order; without
chunking a prefill longer than the budget runs alone. So a long prompt ranked *below* the running decodes
waits for budget to be free (it is delayed, they do not stall), and one ranked *above* them (a higher
tier) takes the whole step and stalls them: the claim's case. Both are measured; the claims are judged on
the second. The long prompt alone (no decodes) is measured too, chunked and whole, to tell the cost of
chunking itself from that of the decodes riding along in every chunk's step."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

from engine.core.engine import Engine
from engine.experiments.drive import config
from engine.experiments.result import ExperimentResult, Finding, Plot, pct, times
from engine.request.sampling import SamplingParams

# "No decode stall": a decode may wait on the long prompt's chunk at most as long as on its own work, i.e.
# no gap beyond twice a normal one. A gap of many normal gaps is a stall whether or not the decodes got a
# token in every step: their clients see the pause either way.
STALL_FACTOR = 2.0
# "About 10% longer": the claimed +10% give or take 10 points. Below 0 chunking is not a cost at all; past
# +20% it costs at least twice what the claim says.
CLAIMED_EXTRA, EXTRA_BAND = 0.10, 0.10


@dataclass(frozen=True)
class ChunkedParams:
    model: str = "tiny"
    decodes: int = 16  # requests decoding when the long prompt arrives
    decode_prompt_len: int = 64
    long_prompt_len: int = 4096
    max_num_batched_tokens: int = 512
    prefill_chunk_size: int = 256
    seed: int = 0


def _run(p: ChunkedParams, chunked: bool, long_tier: str, decodes: int) -> dict:
    engine = Engine(config(model=p.model, enable_chunked_prefill=chunked, seed=p.seed,
                           max_num_batched_tokens=p.max_num_batched_tokens,
                           prefill_chunk_size=p.prefill_chunk_size, max_num_seqs=decodes + 1,
                           admission="queue-length"))
    # one short request first, so that a run with no decodes starts as warm as one with them (a prompt that
    # shares no prefix with the others)
    engine.add_request([255 - j % 256 for j in range(p.decode_prompt_len)],
                       SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True))
    while engine.has_unfinished_requests():
        engine.step()
    # the decodes outlast the long prompt's chunked prefill, so every gap it causes falls inside them
    steps_of_long = -(-p.long_prompt_len // p.prefill_chunk_size)
    decode = SamplingParams(max_tokens=32 + 2 * steps_of_long, temperature=0.0, ignore_eos=True)
    ids = [engine.add_request([(i * 7 + j) % 256 for j in range(p.decode_prompt_len)], decode, tier="standard")
           for i in range(decodes)]
    done = {}
    while len([o for o in engine.step() if o.token_ids]) < decodes:  # until every decode has its first token
        pass
    for _ in range(4):
        engine.step()
    added = time.monotonic()
    long_id = engine.add_request([(j * 13) % 256 for j in range(p.long_prompt_len)],
                                 SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True), tier=long_tier)
    prefill = _prefill_steps(engine, long_id, ids, done)
    while engine.has_unfinished_requests():
        done.update({o.request_id: o for o in engine.step() if o.finished})
    engine.check_integrity()
    long_first = done[long_id].timing.first_token_time
    out = {"long_ttft_ms": (long_first - added) * 1e3, **prefill}
    if not ids:
        return out
    gaps, normal = [], []
    for rid in ids:
        tt = done[rid].timing.token_times
        gaps += [b - a for a, b in zip(tt, tt[1:], strict=False)]
        normal += [b - a for a, b in zip(tt, tt[1:], strict=False) if b < added]
    decodes_end = max(done[rid].timing.finished_time for rid in ids)
    return {**out, "max_decode_gap_ms": max(gaps) * 1e3, "median_decode_gap_ms": sorted(normal)[len(normal) // 2] * 1e3,
            "decodes_done_after_ms": (decodes_end - added) * 1e3,
            "long_first_token_before_decodes_end": long_first < decodes_end}


def _prefill_steps(engine: Engine, long_id: str, decode_ids: list[str], done: dict) -> dict:
    """Step until the long prompt has its first token: the steps that carried its prefill, the longest of
    them, and how many (step, running decode) pairs passed without a token for the decode (a skipped step)."""
    longest, steps, missed = 0.0, 0, 0
    while long_id not in done and not _tokens(engine, long_id):  # it enters engine.requests at the next step
        before = {r: _tokens(engine, r) for r in decode_ids if r in engine.requests}
        start = time.perf_counter()
        outs = engine.step()
        longest = max(longest, time.perf_counter() - start)
        steps += 1
        done.update({o.request_id: o for o in outs if o.finished})
        missed += sum(1 for r, n in before.items() if r in engine.requests and _tokens(engine, r) == n)
    return {"prefill_steps": steps, "longest_prefill_step_ms": longest * 1e3, "decode_steps_missed": missed}


def _tokens(engine: Engine, request_id: str) -> int:
    request = engine.requests.get(request_id)
    return len(request.token_times) if request is not None else 0


def stall_finding(p: ChunkedParams, on: dict, off: dict) -> Finding:
    """The decodes' largest gap with chunking against STALL_FACTOR normal gaps."""
    largest, normal = on["max_decode_gap_ms"], on["median_decode_gap_ms"]
    bound = STALL_FACTOR * normal
    holds = largest <= bound
    note = ""
    if not holds:
        skipped = (f"the decodes missed {on['decode_steps_missed']} step(s)" if on["decode_steps_missed"] else
                   f"the decodes got a token in every one of the {on['prefill_steps']} steps")
        note = (f"{largest:.0f} ms is {largest / normal:.1f}x a normal gap, {largest / bound:.1f}x the bound: "
                f"{skipped}, but the longest step carrying a {p.prefill_chunk_size}-token chunk took "
                f"{on['longest_prefill_step_ms']:.0f} ms against a normal decode step of {normal:.1f} ms; here a "
                "step's time grows with its tokens, so a chunk slows every decode beside it. Chunking still cuts the "
                f"stall {times(off['max_decode_gap_ms'] / largest)} against the whole prefill.")
    return Finding(
        claim="chunked prefill keeps running decodes flowing while a long prompt is prefilled",
        seed_figure="no decode stall",
        setting=f"{p.decodes} decodes running, a {p.long_prompt_len}-token prompt of a higher tier arrives; chunks of "
                f"{p.prefill_chunk_size}, budget {p.max_num_batched_tokens}",
        measured=f"largest decode gap {largest:.0f} ms chunked ({largest / normal:.1f}x a normal gap of "
                 f"{normal:.1f} ms; longest chunk step {on['longest_prefill_step_ms']:.0f} ms, "
                 f"{on['decode_steps_missed']} decode steps missed) vs {off['max_decode_gap_ms']:.0f} ms whole",
        value=largest / normal, holds=holds,
        rule=f"largest decode gap with chunking <= {STALL_FACTOR:g}x the normal gap (the decodes' median gap before "
             "the long prompt arrives)", note=note)


def cost_finding(p: ChunkedParams, on: dict, off: dict, alone_on: dict, alone_off: dict) -> Finding:
    """The long prompt's extra time to first token with chunking, within CLAIMED_EXTRA +- EXTRA_BAND."""
    extra = on["long_ttft_ms"] / off["long_ttft_ms"] - 1
    alone = alone_on["long_ttft_ms"] / alone_off["long_ttft_ms"] - 1
    lo, hi = CLAIMED_EXTRA - EXTRA_BAND, CLAIMED_EXTRA + EXTRA_BAND
    holds = lo <= extra <= hi
    steps = -(-p.long_prompt_len // p.prefill_chunk_size)
    split = (f"by itself (no decodes) the long prompt takes {_signed(alone)} chunked "
             f"({alone_on['long_ttft_ms']:.0f} vs {alone_off['long_ttft_ms']:.0f} ms)")
    note = ""
    if extra > hi:
        note = (f"{_signed(extra)} is {extra - hi:.1%} over the band's {pct(hi)}: {split}; the rest is the {p.decodes} "
                f"decodes riding along in each of the {steps} chunk steps.")
    elif extra < lo:
        why = (f"the whole prefill of {p.long_prompt_len} tokens in one step costs more here than the same work in "
               "chunks" if alone < lo else
               f"unchunked, the prefill runs alone in one step either way, yet it took {off['long_ttft_ms']:.0f} ms "
               f"with the decodes waiting and {alone_off['long_ttft_ms']:.0f} ms with none: a run-to-run spread as "
               "large as the effect")
        note = f"chunked was {pct(-extra)} faster, below the band's {pct(lo)}: {split}; {why}."
    return Finding(
        claim="the long prompt takes about 10% longer with chunking", seed_figure="about +10%",
        setting="the long prompt's time to first token, chunked vs whole, decodes running",
        measured=f"{on['long_ttft_ms']:.0f} vs {off['long_ttft_ms']:.0f} ms: {_signed(extra)} (alone, no decodes: "
                 f"{_signed(alone)})",
        value=extra, holds=holds,
        rule=f"extra time to first token within {pct(CLAIMED_EXTRA)} +- {EXTRA_BAND * 100:g} points "
             f"({pct(lo)} to {pct(hi)})", note=note)


def _signed(x: float) -> str:
    return f"{'+' if x >= 0 else '-'}{pct(abs(x))}"


def chunked_prefill(p: ChunkedParams) -> ExperimentResult:
    r = {f"{'chunked' if c else 'whole'}, long prompt {tier}": _run(p, c, tier, p.decodes)
         for tier in ("premium", "standard") for c in (True, False)}
    alone = {f"{'chunked' if c else 'whole'}, long prompt alone": _run(p, c, "premium", 0) for c in (True, False)}
    on, off = r["chunked, long prompt premium"], r["whole, long prompt premium"]
    findings = [stall_finding(p, on, off),
                cost_finding(p, on, off, alone["chunked, long prompt alone"], alone["whole, long prompt alone"])]
    same = r["whole, long prompt standard"]
    plot = Plot("largest decode gap and the long prompt's time to first token", "variant", "ms")
    plot.add("largest decode gap (ms)", list(r) + list(alone),
             [v["max_decode_gap_ms"] for v in r.values()] + [None] * len(alone))
    plot.add("long prompt TTFT (ms)", list(r) + list(alone),
             [v["long_ttft_ms"] for v in (*r.values(), *alone.values())])
    data = {**r, **alone, "same_tier_without_chunking": (
        f"a long prompt of the decodes' own tier waits for them without chunking: first token after "
        f"{same['long_ttft_ms']:.0f} ms (decodes done after {same['decodes_done_after_ms']:.0f} ms), largest decode "
        f"gap {same['max_decode_gap_ms']:.0f} ms")}
    return ExperimentResult("chunked-prefill", "Chunked prefill", asdict(p), findings, data, plot)
