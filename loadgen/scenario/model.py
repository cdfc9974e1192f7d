"""What a scenario file becomes: the :class:`Scenario` dataclass, its SLOs and its request specs.

A scenario file with every section (read and validated by :mod:`loadgen.scenario.parse`):

```yaml
name: smoke
seed: 0
target: null               # a URL; null starts the reference engine (``engine`` options)
model: null                # model name to send; null asks GET /v1/models
engine: {model: tiny}      # flags for ``python -m engine.server`` (max_num_seqs -> --max-num-seqs)
workload:
  type: synthetic          # synthetic | trace
  input_len: {dist: uniform, min: 16, max: 64}    # or a number (fixed)
  output_len: 16
  shared_prefix: {num_prompts: 2, length: 64, ratio: 0.5}
  conversations: {turns: 3, think_time_s: 1.0}   # history: real (the server's replies) | synthetic
  cancel: {ratio: 0.1, after_tokens: 8}            # or after_s: 2.0: a share of users closing the tab
  token_range: [10, 250]
  # trace: path, format, time_scale, rate, start_offset_s, block_size, skip_failed, output_len
tiers:                     # weight and SLOs (ms) per service tier
  premium: {weight: 1, slo: {ttft_ms: 300}}   # priority: 0, headers: {x-tenant-class: gold}: sent with its requests
  # timeout_s: 30 (the client gives up: outcome timeout); slo: {max_shed: 0.01}: refusals within 1 % not judged
  standard: {weight: 3, slo: {ttft_ms: 800, tpot_ms: {threshold: 50, quantile: 0.9}}}  # an SLO's own quantile
  # an SLO on the window's mean instead: tpot_ms: {threshold: 50, statistic: mean} (--slo tpot:50@mean)
load: {arrival: poisson, rate: 4, requests: 40, duration_s: 30}   # arrival: poisson|gamma|constant|closed
goodput: {ttft_ms: 800}
client: {max_connections: 0, read_timeout_s: 300, workers: 1, lateness_bound_ms: 10, send_tier: null,
         send_priority: null,  # each tier's request priority (null: with 2+ tiers, when the target takes it)
         retries: 0, retry_max_wait_s: 30,  # resend a shed request (429/503/529) after its Retry-After
         endpoint: null,  # endpoint: completions | chat | responses (null: by prompt kind, as the target takes)
         continuous_usage: null}  # false: never ask for usage in every chunk (null: when the target takes it)
search:                    # for ``slobench capacity`` (see loadgen/capacity/)
  axis: rate               # rate (req/s, open loop with load.arrival) | concurrency (users, closed loop)
  start: 2                 # first load of the ramp
  growth: 2.0              # ramp factor
  tolerance: 0.05          # bisection stops when (first fail - last pass) / last pass <= this
  step_duration_s: 15      # the most a step sends (its cap); a step decided sooner stops then
  warmup_s: 3              # the least warm-up; it goes on while the in-flight count rises ...
  max_warmup_s: null       # ... up to this (default 2 x warmup_s, at most half the step)
  steady_interval_s: 1.0   # in-flight means of successive intervals this long are compared
  steady_tolerance: 0.1    # a rise of more than this share (+ 1 request) is still a trend
  alpha: 0.05              # the sequential test's false breach (and false pass) bound per SLO
  alpha_spending: pocock   # pocock | obrien_fleming | linear
  look_interval_s: 0.5     # the sequential test looks this often
  decluster_run: 2         # exceedances at most this many requests apart count as one (breach side)
  min_samples: null        # each judged tier's requests a step's window holds at least (default 1/(1-quantile):
  max_step_duration_s: null  # 100 for a p99), the step lengthened for it up to this (default 4 x step_duration_s)
  max_steps: 12
  max_duration_s: null     # the run's time budget: no step starts that would end past it (null: none)
  min_load: null           # never_met below it (default start / growth^2; 1 user)
  max_load: null           # never_broke above it (default start * growth^(max_steps - 1))
  quantile: 0.99           # SLO quantile (a tier's slo.quantile overrides it)
  confidence: 0.95         # bootstrap interval of the quantile
  drain_s: null            # after sending: wait this long for answers (default 2x the largest SLO)
  early_stop: true         # end a step once decided (a certain breach, the sequential test) ...
  early_pass: true         # ... or (ramp steps) once every SLO quantile is under pass_margin x its threshold
  pass_margin: 0.5
headroom: 0.2              # spec capacity = rated x (1 - headroom)
```
A mean SLO (``statistic: mean``) judges the mean of a step's (or a run's) values; a failed request counts
as ``inf``, so any failure breaks it. It is a check on the whole window: goodput and per-tier attainment
count requests against the quantile SLOs only, and ``summary.json`` gives the mean SLOs' verdicts apart
(``tiers.<tier>.slo_means``). ``tier_slos`` keeps a mean SLO under the key ``<metric>@mean``
(``results.slo.slo_key``), so that it travels wherever the thresholds go. A tier whose SLOs are all means
needs ``MEAN_MIN_SAMPLES`` (30) requests in a step's window (``search.min_samples`` overrides it).
Trace workloads also take ``input_scale`` / ``output_scale`` (multiply lengths; a Mooncake hash block shrinks
with them, so prefix sharing keeps its shape) and ``max_input_len`` / ``max_output_len`` (caps), to fit
production traces to a small engine, and ``spread_ties_s`` (requests logged with the same timestamp, as in
Mooncake's 3 s buckets, are spread evenly over that many trace seconds instead of arriving at once).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loadgen.results.latency import LATENESS_BOUND_MS, SLO_METRICS
from loadgen.results.slo import SLO, split_slo_key
from loadgen.scenario.options import SearchConfig, StepOptions
from loadgen.workload.arrivals import Arrivals
from loadgen.workload.shaping import TraceShaping, load_shaped_trace
from loadgen.workload.specs import CancelMix, RequestSpec
from loadgen.workload.synthetic import SyntheticWorkload
from loadgen.workload.traces import TraceError, TraceInfo, TraceOptions

ENDPOINTS = ("completions", "chat", "responses")  # client.endpoint, --endpoint
SLO_NAMES = SLO_METRICS  # ttft_ms, ttfot_ms, tpot_ms, e2el_ms: what latency.slo_value judges


class ScenarioError(ValueError):
    """A scenario that cannot run; the message names the key path, what was expected and what was found."""


@dataclass
class Scenario:
    name: str
    seed: int = 0
    target: str | None = None
    model: str | None = None
    engine: dict[str, Any] = field(default_factory=dict)
    workload_type: str = "synthetic"
    synthetic: SyntheticWorkload | None = None
    trace_path: Path | None = None
    trace_format: str | None = None
    trace_options: TraceOptions | None = None
    tiers: dict[str, float] = field(default_factory=dict)
    tier_slos: dict[str, dict[str, float]] = field(default_factory=dict)  # tier -> metric (tpot_ms@mean) -> ms
    arrivals: Arrivals | None = None  # None for a trace's own timestamps
    requests: int | None = None
    duration_s: float | None = None
    goodput: dict[str, float] = field(default_factory=dict)
    max_connections: int = 0
    read_timeout_s: float | None = 300.0
    workers: int = 1
    lateness_bound_ms: float = LATENESS_BOUND_MS
    source: str = ""
    tier_quantiles: dict[str, float] = field(default_factory=dict)  # a tier's own SLO quantile
    slo_quantiles: dict[str, dict[str, float]] = field(default_factory=dict)  # tier -> metric -> its own quantile
    search: SearchConfig | None = None  # for ``slobench capacity``
    step: StepOptions | None = None
    headroom: float = 0.2
    shaping: TraceShaping = field(default_factory=TraceShaping)  # trace workloads: length scaling, caps, ties
    send_tier: bool | None = None  # client.send_tier: None sends tiers when the target accepts service_tier
    # client.send_priority: None sends each tier's priority when there are 2+ tiers and the target accepts it
    send_priority: bool | None = None
    tier_priority: dict[str, int] = field(default_factory=dict)  # tiers.<t>.priority, set explicitly
    tier_headers: dict[str, dict[str, str]] = field(default_factory=dict)  # tiers.<t>.headers
    tier_timeout_s: dict[str, float] = field(default_factory=dict)  # tiers.<t>.timeout_s: the client's deadline
    tier_max_shed: dict[str, float] = field(default_factory=dict)  # tiers.<t>.slo.max_shed: the shed budget
    retries: int = 0  # client.retries: resend a shed request (429 / 503 / 529) up to this many times
    retry_max_wait_s: float = 30.0  # client.retry_max_wait_s: the longest Retry-After honoured
    endpoint: str | None = None  # client.endpoint: completions | chat | responses; None: by prompt kind
    # client.continuous_usage: False never asks for usage in every chunk (it costs the server a little per
    # chunk; without it tokens per chunk are unknown); None asks when the target accepts it
    continuous_usage: bool | None = None
    explicit_fields: set[str] = field(default_factory=set)  # request fields asked for explicitly (errors if rejected)
    cancel: CancelMix | None = None  # workload.cancel: the client cancellation mix

    def slos(self) -> dict[str, list[SLO]]:
        """Each tier's judged SLOs (an empty list for a tier with no promise, e.g. basic)."""
        q = self.step.quantile if self.step else 0.99
        out: dict[str, list[SLO]] = {}
        for t in self.tiers:
            out[t] = []
            for key, v in self.tier_slos.get(t, {}).items():
                k, statistic = split_slo_key(key)
                out[t].append(SLO(k, float(v), self.slo_quantiles.get(t, {}).get(k, self.tier_quantiles.get(t, q)),
                                  statistic, self.tier_max_shed.get(t, 0.0)))
        return out

    def engine_options(self, overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The embedded engine's options: the ``engine`` section with ``overrides`` (``--engine-opt``) on top,
        and, unless one of them sets ``tier_ttft_slo_ms``, the promises its admission keeps taken from the
        tiers' TTFT SLOs. Left at the engine's own (premium 300 ms, standard 800 ms) they would make it
        refuse requests that a scenario with looser promises would accept, and the rating measure that."""
        opts = {**self.engine, **dict(overrides or {})}
        promises = {t: float(s["ttft_ms"]) for t, s in self.tier_slos.items() if "ttft_ms" in s and t in self.tiers}
        if promises and "tier_ttft_slo_ms" not in opts:
            opts["tier_ttft_slo_ms"] = promises
        return opts

    def build(self) -> tuple[list[RequestSpec], dict[str, Any]]:
        """The request specs of this scenario and a description of the workload for the summary."""
        if self.workload_type == "trace":
            specs, info = self.trace_specs()
            self.apply_cancel(specs, self.seed)
            self.apply_deadlines(specs)
            sh = self.shaping
            return specs, {"type": "trace", **info.as_dict(), "input_scale": sh.input_scale,
                           "output_scale": sh.output_scale, "max_input_len": sh.max_input_len}
        times = self.arrivals.times(n=self.requests, duration_s=self.duration_s, seed=self.seed)
        specs = self.synthetic.generate(times, seed=self.seed)
        self.apply_cancel(specs, self.seed)
        self.apply_deadlines(specs)
        return specs, {"type": "synthetic", "requests": len(specs),
                       "duration_s": float(times[-1]) if len(times) else 0.0}

    def apply_deadlines(self, specs: list[RequestSpec]) -> None:
        """Each spec's client deadline, its tier's ``timeout_s`` (in place)."""
        if self.tier_timeout_s:
            for spec in specs:
                spec.deadline_s = self.tier_timeout_s.get(spec.tier or "")

    def apply_cancel(self, specs: list[RequestSpec], seed: int) -> None:
        """The cancellation mix (``workload.cancel``), seeded, on specs in place."""
        if self.cancel is not None:
            self.cancel.apply(specs, seed)

    def trace_specs(self, opts: TraceOptions | None = None) -> tuple[list[RequestSpec], TraceInfo]:
        """This trace workload's requests, shaped (scaled, capped, ties spread). ``opts`` replaces the
        scenario's trace options, as a capacity step or a Locust stage does to set its own load and seed."""
        try:
            return load_shaped_trace(self.trace_path, self.trace_format, opts or self.trace_options, self.shaping)
        except TraceError as e:
            raise ScenarioError(f"workload.path: {e}") from e
