"""Scenario files for ``slobench run``: YAML, validated, errors name the key path, expected and found.

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
  conversations: {turns: 3, think_time_s: 1.0}
  token_range: [10, 250]
  # trace: path, format, time_scale, rate, start_offset_s, block_size, skip_failed, output_len
tiers:                     # weight and SLOs (ms) per service tier
  premium: {weight: 1, slo: {ttft_ms: 300}}
  standard: {weight: 3, slo: {ttft_ms: 800}}
load: {arrival: poisson, rate: 4, requests: 40, duration_s: 30}   # arrival: poisson|gamma|constant|closed
goodput: {ttft_ms: 800}
client: {max_connections: 0, read_timeout_s: 300, workers: 1, lateness_bound_ms: 10}
search:                    # for ``slobench capacity`` (see loadgen/capacity/)
  axis: rate               # rate (req/s, open loop with load.arrival) | concurrency (users, closed loop)
  start: 2                 # first load of the ramp
  growth: 2.0              # ramp factor
  tolerance: 0.05          # bisection stops when (first fail - last pass) / last pass <= this
  step_duration_s: 15      # each step sends for this long; its first warmup_s are discarded
  warmup_s: 3
  max_steps: 12
  min_load: null           # never_met below it (default start / growth^2; 1 user)
  max_load: null           # never_broke above it (default start * growth^(max_steps - 1))
  quantile: 0.99           # SLO quantile (a tier's slo.quantile overrides it)
  confidence: 0.95         # bootstrap interval of the quantile
  drain_s: null            # after sending: wait this long for answers (default 2x the largest SLO)
  early_stop: true         # end a step once its breach is certain ...
  early_pass: true         # ... or (ramp steps) once every SLO quantile is under pass_margin x its threshold
  pass_margin: 0.5
headroom: 0.2              # spec capacity = rated x (1 - headroom)
```
Trace workloads also take ``input_scale`` / ``output_scale`` (multiply lengths; a Mooncake hash block shrinks
with them, so prefix sharing keeps its shape) and ``max_input_len`` / ``max_output_len`` (caps), to fit
production traces to a small engine, and ``spread_ties_s`` (requests logged with the same timestamp, as in
Mooncake's 3 s buckets, are spread evenly over that many trace seconds instead of arriving at once).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from loadgen.capacity.search import AXES, SearchConfig
from loadgen.results.slo import SLO
from loadgen.workload.arrivals import KINDS as ARRIVAL_KINDS
from loadgen.workload.arrivals import Arrivals
from loadgen.workload.specs import DEFAULT_TOKEN_RANGE, BlockPrompt, RequestSpec
from loadgen.workload.synthetic import Conversations, LengthDist, SharedPrefix, SyntheticWorkload
from loadgen.workload.traces import FORMATS, TraceError, TraceOptions, load_length_stats, load_trace

SLO_NAMES = ("ttft_ms", "tpot_ms", "e2el_ms")
# service_tier values: the reference engine's, and OpenAI's that map onto them
TIER_NAMES = ("premium", "standard", "basic", "priority", "default", "auto", "flex")

# Options for the embedded reference engine: EngineConfig fields and server flags (``python -m
# engine.server --help``), with their types and choices. loadgen never imports the engine, so this is a
# table; tests/test_scenario.py checks it against EngineConfig and the server's parser.
_opt = type(None)
ENGINE_OPTIONS: dict[str, tuple[tuple, tuple | None]] = {
    "model": ((str,), None),
    "device": ((str, _opt), None),
    "dtype": ((str, _opt), None),
    "seed": ((int,), None),
    "num_threads": ((int, _opt), None),
    "max_model_len": ((int, _opt), None),
    "block_size": ((int,), None),
    "num_kv_blocks": ((int, _opt), None),
    "kv_cache_tokens": ((int,), None),
    "num_host_blocks": ((int, _opt), None),
    "enable_prefix_caching": ((bool,), None),
    "kv_allocation": ((str,), ("paged", "contiguous")),
    "batching": ((str,), ("continuous", "static")),
    "max_num_seqs": ((int,), None),
    "max_num_batched_tokens": ((int,), None),
    "enable_chunked_prefill": ((bool,), None),
    "prefill_chunk_size": ((int,), None),
    "rebatch_interval": ((int,), None),
    "premium_reserved_kv_frac": ((float,), None),
    "premium_reserved_slots": ((int,), None),
    "max_waiting_per_tier": ((dict,), None),
    "kv_watermark": ((float,), None),
    "use_triton": ((bool, _opt), None),
    # server flags
    "api_key": ((str, _opt), None),
    "drain_timeout": ((float,), None),
    "log_level": ((str,), ("debug", "info", "warning", "error")),
    "switch_interval_ms": ((float,), None),
}


class ScenarioError(ValueError):
    pass


_MISSING = object()
_TYPE_NAMES = {int: "an integer", float: "a number", str: "a string", bool: "true/false", dict: "a mapping",
               list: "a list"}


def _tname(types) -> str:
    types = types if isinstance(types, tuple) else (types,)
    return " or ".join(_TYPE_NAMES.get(t, t.__name__) for t in types if t is not type(None)) + (
        " or null" if type(None) in types else "")


class _Node:
    """A mapping with its key path, for error messages."""

    def __init__(self, data: Any, path: str):
        if not isinstance(data, dict):
            raise ScenarioError(f"{path or 'scenario'}: expected a mapping, found {_found(data)}")
        self.data, self.path = data, path
        self.used: set[str] = set()

    def key(self, k: str) -> str:
        return f"{self.path}.{k}" if self.path else k

    def get(self, k: str, types, default=_MISSING, *, choices=None, min_value=None, positive=False):
        self.used.add(k)
        if k not in self.data or self.data[k] is None and default is not _MISSING and default is not None:
            if default is _MISSING:
                raise ScenarioError(f"{self.key(k)}: required, expected {_tname(types)}")
            return default
        v = self.data[k]
        t = types if isinstance(types, tuple) else (types,)
        if float in t and isinstance(v, int) and not isinstance(v, bool):
            v = float(v)
        if isinstance(v, bool) and bool not in t or not isinstance(v, t):
            raise ScenarioError(f"{self.key(k)}: expected {_tname(types)}, found {_found(v)}")
        if choices is not None and v not in choices:
            raise ScenarioError(f"{self.key(k)}: expected one of {', '.join(map(str, choices))}, found {v!r}")
        if positive and v is not None and not v > 0:
            raise ScenarioError(f"{self.key(k)}: expected a value > 0, found {v!r}")
        if min_value is not None and v is not None and v < min_value:
            raise ScenarioError(f"{self.key(k)}: expected a value >= {min_value}, found {v!r}")
        return v

    def child(self, k: str, default=_MISSING) -> _Node | None:
        self.used.add(k)
        if k not in self.data or self.data[k] is None:
            if default is _MISSING:
                raise ScenarioError(f"{self.key(k)}: required, expected a mapping")
            return default
        return _Node(self.data[k], self.key(k))

    def check_unknown(self) -> None:
        extra = sorted(set(self.data) - self.used)
        if extra:
            raise ScenarioError(f"{self.key(extra[0])}: unknown key (known: {', '.join(sorted(self.used))})")


def _found(v: Any) -> str:
    return f"{type(v).__name__} {v!r}" if not isinstance(v, (dict, list)) else type(v).__name__


@dataclass
class StepOptions:
    """How ``slobench capacity`` measures one load step."""

    step_duration_s: float = 15.0  # sending time of a step, warm-up included
    warmup_s: float = 3.0  # discarded start of each step
    quantile: float = 0.99
    confidence: float = 0.95
    drain_s: float | None = None  # None: 2x the largest SLO threshold, at least 2 s
    early_stop: bool = True  # end a step once its breach is certain
    early_pass: bool = True  # ramp steps: ... or once every SLO is clearly met (quantile < pass_margin x threshold)
    pass_margin: float = 0.5
    settle_timeout_s: float = 30.0  # wait for the target to go idle between steps

    @property
    def window_s(self) -> float:
        return self.step_duration_s - self.warmup_s


def spread_ties(specs: list[RequestSpec], width_s: float) -> None:
    """Requests that share a timestamp (a trace logged in buckets: Mooncake's are 3 s) are spread evenly
    over ``width_s`` after it, in their order, instead of arriving in the same instant."""
    if width_s <= 0 or not specs:
        return
    i = 0
    while i < len(specs):
        j = i
        while j + 1 < len(specs) and specs[j + 1].arrival_s == specs[i].arrival_s:
            j += 1
        n = j - i + 1
        for k in range(1, n):
            specs[i + k].arrival_s += width_s * k / n
        i = j + 1
    specs.sort(key=lambda sp: sp.arrival_s)


def scale_specs(specs: list[RequestSpec], input_scale: float = 1.0, output_scale: float = 1.0,
                max_input_len: int | None = None, max_output_len: int | None = None) -> None:
    """Scale (then cap) the lengths of trace requests in place. Block prompts keep their hash ids with a
    proportionally smaller block, so two prompts share the same fraction of their tokens as before."""
    if input_scale == 1.0 and output_scale == 1.0 and max_input_len is None and max_output_len is None:
        return
    for sp in specs:
        p = sp.prompt
        if isinstance(p, BlockPrompt) and (input_scale != 1.0 or max_input_len is not None):
            bs = max(1, round(p.block_size * input_scale))
            n = min(max(1, math.ceil(p.num_tokens * input_scale)), len(p.hash_ids) * bs)
            if max_input_len is not None:
                n = min(n, max_input_len)
            sp.prompt = BlockPrompt(p.hash_ids, n, bs, p.seed, p.token_range)
            sp.prompt_tokens = n
        out = max(1, math.ceil(sp.max_tokens * output_scale))
        sp.max_tokens = min(out, max_output_len) if max_output_len is not None else out


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
    tier_slos: dict[str, dict[str, float]] = field(default_factory=dict)
    arrivals: Arrivals | None = None  # None for a trace's own timestamps
    requests: int | None = None
    duration_s: float | None = None
    goodput: dict[str, float] = field(default_factory=dict)
    max_connections: int = 0
    read_timeout_s: float | None = 300.0
    workers: int = 1
    lateness_bound_ms: float = 10.0
    source: str = ""
    tier_quantiles: dict[str, float] = field(default_factory=dict)  # a tier's own SLO quantile
    search: SearchConfig | None = None  # for ``slobench capacity``
    step: StepOptions | None = None
    headroom: float = 0.2
    input_scale: float = 1.0  # trace workloads: length scaling and caps
    output_scale: float = 1.0
    max_input_len: int | None = None
    max_output_len: int | None = None
    spread_ties_s: float = 0.0  # trace time buckets: spread requests sharing a timestamp over this (trace s)

    def slos(self) -> dict[str, list[SLO]]:
        """Each tier's judged SLOs (an empty list for a tier with no promise, e.g. basic)."""
        q = self.step.quantile if self.step else 0.99
        return {t: [SLO(k, float(v), self.tier_quantiles.get(t, q)) for k, v in self.tier_slos.get(t, {}).items()]
                for t in self.tiers}

    def build(self) -> tuple[list[RequestSpec], dict[str, Any]]:
        """The request specs of this scenario and a description of the workload for the summary."""
        if self.workload_type == "trace":
            try:
                specs, info = load_trace(self.trace_path, self.trace_format, self.trace_options)
            except TraceError as e:
                raise ScenarioError(f"workload.path: {e}") from e
            scale_specs(specs, self.input_scale, self.output_scale, self.max_input_len, self.max_output_len)
            spread_ties(specs, self.spread_ties_s * info.time_factor)
            return specs, {"type": "trace", **info.as_dict(), "input_scale": self.input_scale,
                           "output_scale": self.output_scale, "max_input_len": self.max_input_len}
        times = self.arrivals.times(n=self.requests, duration_s=self.duration_s, seed=self.seed)
        specs = self.synthetic.generate(times, seed=self.seed)
        return specs, {"type": "synthetic", "requests": len(specs),
                       "duration_s": float(times[-1]) if len(times) else 0.0}


def _length(node: _Node, k: str, default: int, base: Path) -> LengthDist:
    v = node.data.get(k)
    node.used.add(k)
    if v is None:
        return LengthDist("fixed", value=default)
    if isinstance(v, int) and not isinstance(v, bool):
        if v < 1:
            raise ScenarioError(f"{node.key(k)}: expected a length >= 1, found {v}")
        return LengthDist("fixed", value=v)
    d = _Node(v, node.key(k))
    dist = d.get("dist", str, choices=LengthDist.KINDS)
    kw: dict[str, Any] = {"dist": dist}
    for name, t in (("value", int), ("min", int), ("max", int), ("mean", float), ("std", float),
                    ("sigma", float)):
        if name in d.data:
            kw[name] = d.get(name, t)
    if dist == "empirical":
        if "from" in d.data:  # lengths of a trace / length-stats file: from: PATH, column: input|output
            p = _resolve(d.get("from", str), base)
            col = d.get("column", str, "input", choices=("input", "output"))
            try:
                ins, outs = load_length_stats(p)
            except (TraceError, OSError, KeyError) as e:
                raise ScenarioError(f"{d.key('from')}: {e}") from e
            kw["values"] = ins if col == "input" else outs
        else:
            kw["values"] = d.get("values", list)
    d.check_unknown()
    try:
        return LengthDist(**kw)
    except ValueError as e:
        raise ScenarioError(f"{node.key(k)}: {e}") from e


def _resolve(p: str, base: Path) -> Path:
    path = Path(p).expanduser()
    if path.is_absolute():
        return path
    for root in (base, Path.cwd()):
        if (root / path).exists():
            return root / path
    return base / path


def load_scenario(path: str | Path, overrides: list[str] | None = None) -> Scenario:
    """Read and validate a scenario file; ``overrides`` are ``dotted.key=VALUE`` strings (VALUE is YAML)
    applied before validation, so their mistakes are reported like the file's."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ScenarioError(f"scenario file not found: {path}") from None
    except IsADirectoryError:
        raise ScenarioError(f"{path}: expected a scenario file, found a folder") from None
    except UnicodeDecodeError:
        raise ScenarioError(f"{path}: expected a YAML text file, found bytes that are not UTF-8") from None
    except yaml.YAMLError as e:
        raise ScenarioError(f"{path}: not valid YAML: {e}".replace("\n", " ")) from None
    for item in overrides or []:
        raw = apply_override(raw, item)
    try:
        return parse_scenario(raw, base=path.parent, default_name=path.stem, source=str(path))
    except ScenarioError as e:
        raise ScenarioError(f"{path}: {e}") from None


def apply_override(raw: Any, item: str) -> Any:
    """``search.start=4`` -> raw["search"]["start"] = 4 (missing mappings are created)."""
    key, sep, value = item.partition("=")
    if not sep or not key or any(not k for k in key.split(".")):
        raise ScenarioError(f"--set {item!r}: expected KEY=VALUE with a dotted KEY, e.g. search.start=4")
    try:
        v = yaml.safe_load(value)
    except yaml.YAMLError:
        raise ScenarioError(f"--set {item!r}: the value is not valid YAML") from None
    raw = {} if raw is None else raw
    node, parts = raw, key.split(".")
    for i, k in enumerate(parts[:-1]):
        if not isinstance(node, dict):
            raise ScenarioError(f"--set {key}: {'.'.join(parts[:i]) or 'scenario'} is not a mapping")
        if node.get(k) is None:
            node[k] = {}
        node = node[k]
    if not isinstance(node, dict):
        raise ScenarioError(f"--set {key}: {'.'.join(parts[:-1])} is not a mapping")
    node[parts[-1]] = v
    return raw


def parse_scenario(
    raw: Any, base: Path = Path("."), default_name: str = "scenario", source: str = ""
) -> Scenario:
    root = _Node(raw if raw is not None else {}, "")
    s = Scenario(name=root.get("name", str, default_name), source=source)
    s.seed = root.get("seed", int, 0)
    s.target = root.get("target", (str, type(None)), None)
    if s.target is not None and not s.target.startswith(("http://", "https://")):
        raise ScenarioError(f"target: expected an http(s) URL or null, found {s.target!r}")
    s.model = root.get("model", (str, type(None)), None)
    eng = root.child("engine", None)
    s.engine = _engine_options(eng) if eng else {}

    tiers = root.child("tiers", None)
    if tiers:
        for name in tiers.data:
            if name not in TIER_NAMES:
                raise ScenarioError(f"{tiers.key(str(name))}: unknown service tier (expected one of "
                                    f"{', '.join(TIER_NAMES)})")
            t = tiers.child(name)
            s.tiers[name] = t.get("weight", float, 1.0, min_value=0.0)
            slo = t.child("slo", None)
            if slo:
                for k in list(slo.data):
                    if k == "quantile":
                        s.tier_quantiles[name] = _quantile(slo, k)
                        continue
                    if k not in SLO_NAMES:
                        raise ScenarioError(f"{slo.key(k)}: unknown SLO (expected {', '.join(SLO_NAMES)} "
                                            "or quantile)")
                    slo.get(k, float, positive=True)
                s.tier_slos[name] = {k: float(v) for k, v in slo.data.items() if k != "quantile"}
            t.check_unknown()
        if s.tiers and sum(s.tiers.values()) <= 0:
            raise ScenarioError("tiers: the weights sum to 0")

    srch = root.child("search", None)
    if srch:
        s.search, s.step = _search(srch)
    s.headroom = root.get("headroom", float, 0.2, min_value=0.0)
    if not s.headroom < 1:
        raise ScenarioError(f"headroom: expected a fraction in [0, 1), found {s.headroom!r}")

    load = root.child("load", None) or _Node({}, "load")
    s.requests = load.get("requests", (int, type(None)), None, min_value=1)
    s.duration_s = load.get("duration_s", (float, type(None)), None, positive=True)

    w = root.child("workload")
    s.workload_type = w.get("type", str, "synthetic", choices=("synthetic", "trace"))
    lo_hi = w.get("token_range", list, list(DEFAULT_TOKEN_RANGE))
    if len(lo_hi) != 2 or not all(isinstance(x, int) for x in lo_hi) or not 0 <= lo_hi[0] < lo_hi[1]:
        raise ScenarioError(f"workload.token_range: expected [lo, hi] with 0 <= lo < hi, found {lo_hi}")

    arrival = load.get("arrival", str, "trace" if s.workload_type == "trace" else "poisson",
                       choices=(*ARRIVAL_KINDS, "trace"))
    if arrival != "trace":
        try:
            s.arrivals = Arrivals(
                arrival, rate=load.get("rate", float, 1.0, positive=True),
                burstiness=load.get("burstiness", float, 1.0, positive=True),
                concurrency=load.get("concurrency", int, 1 if arrival == "closed" and s.search else 0, min_value=0),
            )
        except ValueError as e:
            raise ScenarioError(f"load: {e}") from e
    elif s.workload_type != "trace":
        raise ScenarioError("load.arrival: 'trace' needs workload.type: trace")
    if s.search and s.search.axis == "rate" and arrival == "closed":
        raise ScenarioError("search.axis: 'rate' needs open-loop arrivals, found load.arrival: closed "
                            "(use axis: concurrency)")

    if s.workload_type == "synthetic":
        if s.requests is None and s.duration_s is None and s.search:
            s.duration_s = s.step.step_duration_s  # `slobench run` on a capacity scenario: one step's worth
            if arrival == "closed":
                s.requests = 100
        if s.requests is None and (s.duration_s is None or arrival == "closed"):
            raise ScenarioError("load.requests: required (or load.duration_s for open-loop arrivals)")
        sp = w.child("shared_prefix", None)
        conv = w.child("conversations", None)
        s.synthetic = SyntheticWorkload(
            input_len=_length(w, "input_len", 128, base),
            output_len=_length(w, "output_len", 64, base),
            shared_prefix=SharedPrefix(
                sp.get("num_prompts", int, 1, min_value=1), sp.get("length", int, 256, min_value=1),
                sp.get("ratio", float, 1.0, min_value=0.0),
            ) if sp else None,
            conversations=Conversations(
                conv.get("turns", int, 3, min_value=1), conv.get("think_time_s", float, 2.0, min_value=0.0),
                conv.get("answer_tokens", int, 32, min_value=0),
            ) if conv else None,
            tiers=s.tiers, token_range=(lo_hi[0], lo_hi[1]), ignore_eos=w.get("ignore_eos", bool, True),
        )
        if sp and not sp.data.get("ratio", 1.0) <= 1:
            raise ScenarioError(f"workload.shared_prefix.ratio: expected a fraction in [0, 1], "
                                f"found {sp.data['ratio']!r}")
        for n in (sp, conv):
            if n:
                n.check_unknown()
    else:
        s.trace_path = _resolve(w.get("path", str), base)
        if not s.trace_path.is_file():
            raise ScenarioError(f"workload.path: expected a trace file, found no file at {s.trace_path}")
        s.trace_format = w.get("format", (str, type(None)), None, choices=(*FORMATS, None))
        s.input_scale = w.get("input_scale", float, 1.0, positive=True)
        s.output_scale = w.get("output_scale", float, 1.0, positive=True)
        s.max_input_len = w.get("max_input_len", (int, type(None)), None, min_value=1)
        s.max_output_len = w.get("max_output_len", (int, type(None)), None, min_value=1)
        s.spread_ties_s = w.get("spread_ties_s", float, 0.0, min_value=0.0)
        s.trace_options = TraceOptions(
            time_scale=w.get("time_scale", float, 1.0, positive=True),
            rate=load.get("rate", (float, type(None)), None, positive=True) if arrival == "trace" else None,
            start_offset_s=w.get("start_offset_s", float, 0.0, min_value=0.0),
            max_requests=s.requests, max_duration_s=s.duration_s,
            block_size=w.get("block_size", int, 512, min_value=1), seed=s.seed,
            skip_failed=w.get("skip_failed", bool, True), token_range=(lo_hi[0], lo_hi[1]),
            output_len=w.get("output_len", int, 128, min_value=1),
            arrivals=s.arrivals, tiers=s.tiers,
        )
    w.check_unknown()
    load.check_unknown()

    g = raw.get("goodput") if isinstance(raw, dict) else None
    root.used.add("goodput")
    if g is not None:
        gn = _Node(g, "goodput")
        for k in list(gn.data):
            if k not in SLO_NAMES:
                raise ScenarioError(f"goodput.{k}: unknown SLO (expected {', '.join(SLO_NAMES)})")
            s.goodput[k] = gn.get(k, float, positive=True)
    c = root.child("client", None)
    if c:
        s.max_connections = c.get("max_connections", int, 0, min_value=0)
        s.read_timeout_s = c.get("read_timeout_s", (float, type(None)), 300.0, positive=True)
        s.workers = c.get("workers", int, 1, min_value=1)
        s.lateness_bound_ms = c.get("lateness_bound_ms", float, 10.0, positive=True)
        c.check_unknown()
    root.check_unknown()
    if s.search and not any(s.tier_slos.values()):
        raise ScenarioError("tiers: the capacity search needs at least one tier with an SLO, e.g. "
                            "tiers: {standard: {slo: {ttft_ms: 800}}}")
    return s


def _quantile(node: _Node, k: str) -> float:
    q = node.get(k, float)
    if not 0 < q < 1:
        raise ScenarioError(f"{node.key(k)}: expected a quantile between 0 and 1 (0.99 for p99), found {q!r}")
    return q


def _engine_options(eng: _Node) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k in eng.data:
        if k in ("host", "port"):
            raise ScenarioError(f"{eng.key(k)}: the embedded engine always listens on a free loopback port; "
                                "to use a server of your own, set target: http://HOST:PORT")
        if k not in ENGINE_OPTIONS:
            raise ScenarioError(f"{eng.key(str(k))}: unknown engine option (known: {', '.join(ENGINE_OPTIONS)})")
        types, choices = ENGINE_OPTIONS[k]
        v = eng.get(k, types, choices=choices)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v < 0:
            raise ScenarioError(f"{eng.key(k)}: expected a value >= 0, found {v!r}")
        if k == "max_waiting_per_tier":
            for tier, n in v.items():
                if tier not in ("premium", "standard", "basic") or isinstance(n, bool) or not isinstance(n, int):
                    raise ScenarioError(f"{eng.key(k)}.{tier}: expected premium|standard|basic: an integer, "
                                        f"found {_found(n)}")
        out[k] = v
    return out


def _search(node: _Node) -> tuple[SearchConfig, StepOptions]:
    axis = node.get("axis", str, "rate", choices=AXES)
    step = StepOptions(
        step_duration_s=node.get("step_duration_s", float, 15.0, positive=True),
        warmup_s=node.get("warmup_s", float, 3.0, min_value=0.0),
        quantile=_quantile(node, "quantile") if "quantile" in node.data else 0.99,
        confidence=node.get("confidence", float, 0.95, positive=True),
        drain_s=node.get("drain_s", (float, type(None)), None, min_value=0.0),
        early_stop=node.get("early_stop", bool, True),
        early_pass=node.get("early_pass", bool, True),
        pass_margin=node.get("pass_margin", float, 0.5, positive=True),
        settle_timeout_s=node.get("settle_timeout_s", float, 30.0, min_value=0.0),
    )
    if not step.warmup_s < step.step_duration_s:
        raise ScenarioError(f"search.warmup_s: expected less than step_duration_s ({step.step_duration_s:g}), "
                            f"found {step.warmup_s:g}")
    if not step.pass_margin < 1:
        raise ScenarioError(f"search.pass_margin: expected a fraction in (0, 1), found {step.pass_margin!r}")
    if not step.confidence < 1:
        raise ScenarioError(f"search.confidence: expected a fraction in (0, 1), found {step.confidence!r}")
    start = node.get("start", float, 1.0, positive=True)
    growth = node.get("growth", float, 2.0, positive=True)
    if not growth > 1:
        raise ScenarioError(f"search.growth: expected a factor > 1, found {growth!r}")
    tol = node.get("tolerance", float, 0.05, positive=True)
    if not tol < 1:
        raise ScenarioError(f"search.tolerance: expected a fraction in (0, 1), found {tol!r}")
    kw = dict(axis=axis, start=start, growth=growth, tolerance=tol,
              max_steps=node.get("max_steps", int, 12, min_value=1),
              min_load=node.get("min_load", (float, type(None)), None, positive=True),
              max_load=node.get("max_load", (float, type(None)), None, positive=True))
    node.check_unknown()
    try:
        cfg = SearchConfig(**kw)
    except ValueError as e:
        raise ScenarioError(f"search: {e}") from None
    return cfg, step
