"""Step timing: a running target's engine step times measured at a few fixed batch sizes and prompt lengths
(the plan's probe, ``slobench plan --calibrate``, its points set by ``--probe-*``), and the step-time model
(``step_model.LinearStep``) fitted to them, which the simulation prices engine steps with.

Decode points: ``batch`` closed-loop users each send ``rounds`` requests of a fixed prompt length and
``output_tokens`` tokens (EOS ignored), so about ``batch`` sequences decode together; a request's decode
step is its decode time / (tokens - 1), and what its steps carried is read off the records themselves (the
sequences decoding beside it, the prompts prefilled meanwhile), so a refused request (429) or a user
still prefilling does not count as batch it was not. Prefill points: one user at a time sends prompts of a
few lengths for a single token; the prefill time is one step with that many new tokens, or, for a prompt
longer than the engine's prefill chunk (``chunk``), its chunks' steps, each over the prefix computed before
it (so the fit sees attention over a cached prefix, which a long prompt's later chunks pay for).
Times are the server's own per-request timing where the records carry it (``server``: the reference
engine's timing object, vLLM's per-request metrics), else the client's (TTFT; time from the first to the
last token), which then include the network. Each decode point's mean is one observation (the model is
linear, so means map onto means), each prefill point's median (its requests are alike: a pause is noise);
the fit is a least squares (numpy) of step time on [1, sequences, new tokens, attention pairs], weighted to
relative error, with no coefficient below zero (a negative one is dropped and the rest refitted).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from loadgen.drivers.event_loop import run_sync
from loadgen.drivers.factory import make_driver
from loadgen.drivers.http_request import ClientConfig
from loadgen.planning.step_model import LinearStep, prefill_steps
from loadgen.results import latency
from loadgen.results.records import RecordWriter, read_records
from loadgen.target.prepare import TargetOptions, prepare_target
from loadgen.workload.specs import DEFAULT_TOKEN_RANGE, RequestSpec

FEATURES = ("const_s", "per_seq_s", "per_token_s", "per_pair_s")


@dataclass(frozen=True)
class StepTimingSettings:
    """Which points to time (decode: each batch size at each prompt length; prefill: each prompt length alone)
    and how many requests each gets."""

    batches: tuple[int, ...] = (1, 8, 32)
    contexts: tuple[int, ...] = (64, 384)  # decode points' prompt lengths
    output_tokens: int = 32
    prefill_lengths: tuple[int, ...] = (32, 128, 256)  # longer than ``chunk``: several steps, summed
    chunk: int | None = None  # the engine's prefill chunk (None: a prompt is prefilled in one step)
    rounds: int = 5  # requests per user at a decode point
    prefill_repeats: int = 10

    def __post_init__(self) -> None:
        if not self.batches or min(self.batches) < 1 or not self.contexts or min(self.contexts) < 1:
            raise ValueError("the probe needs batch sizes and prompt lengths >= 1")
        if self.output_tokens < 3 or self.rounds < 1 or self.prefill_repeats < 1:
            raise ValueError("the probe needs output_tokens >= 3, rounds >= 1 and prefill_repeats >= 1")
        if not self.prefill_lengths or min(self.prefill_lengths) < 1:
            raise ValueError("the probe needs prefill lengths >= 1")


@dataclass(frozen=True)
class TimingPoint:
    """One point to time: a batch of closed-loop users decoding, or one prompt prefilled alone."""

    kind: str  # decode | prefill
    batch: int
    prompt: int
    max_tokens: int
    requests: int


@dataclass
class Observation:
    point: TimingPoint
    step_s: float  # the median measured step (decode) or prefill time
    features: tuple[float, float, float, float]
    requests: int  # records it was measured from
    source: str  # "server timing" | "client timing"


@dataclass
class StepTimeFit:
    """The step-time model fitted to the timed points (scaled by the load points when there are some)."""

    model: LinearStep
    observations: list[Observation]
    rel_rms: float  # the fit's root-mean-square relative error over the observations
    wall_s: float
    source: str
    dropped: list[str] = field(default_factory=list)  # coefficients fixed at 0 (they came out negative)
    # with load points (planning/load_point.py): the timed points' own fit (``probe_model`` in the plan's JSON),
    # and the points that scaled it into ``model``
    unscaled_model: LinearStep | None = None
    load_points: list[Any] = field(default_factory=list)  # load_point.LoadPoint

    def as_dict(self) -> dict:
        return {"model": self.model.as_dict(), "rel_rms": self.rel_rms, "wall_s": self.wall_s, "source": self.source,
                "dropped": self.dropped,
                "probe_model": self.unscaled_model.as_dict() if self.unscaled_model else None,
                "load_points": [p.as_dict() for p in self.load_points],
                "observations": [asdict(o.point) | {"step_s": o.step_s, "requests": o.requests, "source": o.source,
                                                    "predicted_s": self.predicted(o)} for o in self.observations]}

    def predicted(self, o: Observation) -> float:
        """The timed points' fit's time for the observation's steps (several for a chunked prefill: its features
        sum)."""
        m = self.unscaled_model or self.model
        return float(np.dot([m.const_s, m.per_seq_s, m.per_token_s, m.per_pair_s], o.features))


def timing_points(settings: StepTimingSettings) -> list[TimingPoint]:
    out = [TimingPoint("decode", b, p, settings.output_tokens, b * settings.rounds)
           for p in settings.contexts for b in settings.batches]
    return out + [TimingPoint("prefill", 1, p, 1, settings.prefill_repeats) for p in settings.prefill_lengths]


def specs_for(pt: TimingPoint, index: int, seed: int = 0) -> list[RequestSpec]:
    """Distinct random prompts (no prefix-cache hits between them), EOS ignored."""
    rng = np.random.default_rng([seed, index])
    lo, hi = DEFAULT_TOKEN_RANGE
    return [RequestSpec(id=f"p{index}-{k}", arrival_s=0.0, prompt=rng.integers(lo, hi, pt.prompt).tolist(),
                        max_tokens=pt.max_tokens, ignore_eos=True, prompt_tokens=pt.prompt)
            for k in range(pt.requests)]


async def _send(cfg: ClientConfig, work: list[tuple[TimingPoint, list[RequestSpec]]], path: Path) -> None:
    with RecordWriter(path) as writer:
        driver = make_driver("aiohttp", cfg, writer)
        try:
            await driver.open()
            for stage, (pt, specs) in enumerate(work):
                await driver.warm_up(pt.batch)
                await driver.run(specs, stage=stage, concurrency=pt.batch)
        finally:
            await driver.close()


def measure(target: str, settings: StepTimingSettings, work_dir: Path,
            model: str | None = None) -> tuple[list[Observation], float]:
    """Send the timing points to ``target``; (one observation per point that has ok records, wall seconds)."""
    pts = timing_points(settings)
    work = [(pt, specs_for(pt, i)) for i, pt in enumerate(pts)]
    every = [s for _, specs in work for s in specs]
    t0 = time.monotonic()
    prepared = prepare_target(target, model, every, TargetOptions())
    prepared.adapt(every)
    cfg = ClientConfig(target, model=prepared.model, shape=prepared.shape)
    path = Path(work_dir) / "step-timing-requests.jsonl"
    path.unlink(missing_ok=True)
    run_sync(lambda: _send(cfg, work, path))
    wall = time.monotonic() - t0
    by_stage: dict[int, list[dict]] = {}
    for r in read_records(path):
        if r.get("status") == "ok":
            by_stage.setdefault(int(r["stage"]), []).append(r)
    obs = [o for i, pt in enumerate(pts) if (o := observe(pt, by_stage.get(i, []), settings.chunk)) is not None]
    return obs, wall


def observe(pt: TimingPoint, records: list[dict], chunk: int | None = None) -> Observation | None:
    """One point's mean step (decode) or prefill time and the mean features of the steps it spans."""
    if pt.kind == "prefill":
        return _observe_prefill(pt, records, chunk)
    rows = []
    for r in records:
        srv = r.get("server") or {}
        out = r.get("output_tokens") or len(r.get("token_s") or [])
        if out < 2 or r.get("first_token_s") is None or r.get("done_s") is None:
            continue
        if srv.get("decode_ms") is not None:
            v, src = srv["decode_ms"] / 1e3, "server timing"
        elif (gen := latency.generation_ms(r)) is not None:
            v, src = gen / 1e3, "client timing"
        else:
            continue
        rows.append((r["first_token_s"], r["done_s"], out, r.get("prompt_tokens") or pt.prompt, v, src))
    if not rows:
        return None
    ys, feats = [], []
    for f, d, out, prompt, v, _ in rows:
        span, steps = max(d - f, 1e-9), out - 1
        # what shared its decode steps, on the client's one clock: the sequences decoding beside it (time
        # weighted) and the prompts prefilled meanwhile (those whose first token came inside its span)
        batch = sum(max(0.0, min(d, d2) - max(f, f2)) for f2, d2, *_ in rows) / span
        pf = sum(p2 for f2, _, _, p2, *_ in rows if f < f2 <= d) / steps
        pf_seqs = sum(1 for f2, *_ in rows if f < f2 <= d) / steps
        ctx = prompt + out / 2
        ys.append(v / steps)
        feats.append((1.0, batch + pf_seqs, batch + pf, batch * ctx + pf * prompt / 2))
    src = " + ".join(sorted({row[-1] for row in rows}))
    mean = tuple(float(x) for x in np.mean(np.asarray(feats), axis=0))
    return Observation(pt, float(np.mean(ys)), mean, len(rows), src)


def prefill_features(prompt: float, chunk: int | None) -> tuple[float, float, float, float]:
    """[steps, sequences, new tokens, attention pairs] summed over a lone prompt's prefill steps
    (``step_model.prefill_steps``: one step, or one per chunk)."""
    steps = prefill_steps(max(int(round(prompt)), 1), chunk)
    return (float(len(steps)), float(sum(s[0] for s in steps)), float(sum(s[1] for s in steps)),
            float(sum(s[3] for s in steps)))


def _observe_prefill(pt: TimingPoint, records: list[dict], chunk: int | None) -> Observation | None:
    vals, lens, sources = [], [], set()
    for r in records:
        srv = r.get("server") or {}
        if srv.get("prefill_ms") is not None:
            vals.append(srv["prefill_ms"] / 1e3)
            sources.add("server timing")
        elif (ttft := latency.ttft_ms(r)) is not None:
            vals.append(ttft / 1e3)
            sources.add("client timing")
        else:
            continue
        lens.append(r.get("prompt_tokens") or pt.prompt)
    if not vals:
        return None
    c = float(np.mean(lens))
    # the median: every request here has the same features, and one that met a pause (a collection, the
    # machine's other process) would move a mean by a fifth of a short prompt's prefill
    return Observation(pt, latency.quantile(vals, 0.5), prefill_features(c, chunk), len(vals),
                       " + ".join(sorted(sources)))


def fit(obs: list[Observation]) -> tuple[LinearStep, float, list[str]]:
    """Non-negative, relative-error least squares of the observations' times on their features."""
    if len(obs) < 2:
        raise ValueError("the probe measured fewer than 2 points: nothing to fit")
    X = np.asarray([o.features for o in obs], dtype=float)
    y = np.asarray([o.step_s for o in obs], dtype=float)
    w = 1.0 / np.maximum(y, 1e-9)
    active = list(range(X.shape[1]))
    coef = np.zeros(X.shape[1])
    while active:
        sol, *_ = np.linalg.lstsq(X[:, active] * w[:, None], y * w, rcond=None)
        if (sol >= 0).all():
            coef[:] = 0
            coef[active] = sol
            break
        active.pop(int(np.argmin(sol)))  # the most negative coefficient goes; the rest are refitted
    pred = X @ coef
    rel = float(np.sqrt(np.mean(((pred - y) / y) ** 2)))
    dropped = [FEATURES[k] for k in range(X.shape[1]) if k not in active]
    return LinearStep(*map(float, coef)), rel, dropped


def fit_step_times(target: str, settings: StepTimingSettings, work_dir: Path,
                   model: str | None = None) -> StepTimeFit:
    """Time ``target``'s engine steps at the settings' points and fit the step-time model to them."""
    obs, wall = measure(target, settings, work_dir, model)
    step, rel, dropped = fit(obs)
    sources = " + ".join(sorted({o.source for o in obs}))
    return StepTimeFit(step, obs, rel, wall, sources, dropped)
