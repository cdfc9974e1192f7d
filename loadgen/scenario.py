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
```
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .arrivals import KINDS as ARRIVAL_KINDS
from .arrivals import Arrivals
from .traces import FORMATS, TraceError, TraceOptions, load_length_stats, load_trace
from .workloads import DEFAULT_TOKEN_RANGE, Conversations, LengthDist, RequestSpec, SharedPrefix, SyntheticWorkload

SLO_NAMES = ("ttft_ms", "tpot_ms", "e2el_ms")


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

    def build(self) -> tuple[list[RequestSpec], dict[str, Any]]:
        """The request specs of this scenario and a description of the workload for the summary."""
        if self.workload_type == "trace":
            try:
                specs, info = load_trace(self.trace_path, self.trace_format, self.trace_options)
            except TraceError as e:
                raise ScenarioError(f"workload.path: {e}") from e
            return specs, {"type": "trace", **info.as_dict()}
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


def load_scenario(path: str | Path) -> Scenario:
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ScenarioError(f"scenario file not found: {path}") from None
    except yaml.YAMLError as e:
        raise ScenarioError(f"{path}: not valid YAML: {e}".replace("\n", " ")) from None
    try:
        return parse_scenario(raw, base=path.parent, default_name=path.stem, source=str(path))
    except ScenarioError as e:
        raise ScenarioError(f"{path}: {e}") from None


def parse_scenario(
    raw: Any, base: Path = Path("."), default_name: str = "scenario", source: str = ""
) -> Scenario:
    root = _Node(raw if raw is not None else {}, "")
    s = Scenario(name=root.get("name", str, default_name), source=source)
    s.seed = root.get("seed", int, 0)
    s.target = root.get("target", (str, type(None)), None)
    s.model = root.get("model", (str, type(None)), None)
    eng = root.child("engine", None)
    s.engine = dict(eng.data) if eng else {}

    tiers = root.child("tiers", None)
    if tiers:
        for name in tiers.data:
            t = tiers.child(name)
            s.tiers[name] = t.get("weight", float, 1.0, min_value=0.0)
            slo = t.child("slo", None)
            if slo:
                for k in list(slo.data):
                    if k not in SLO_NAMES:
                        raise ScenarioError(f"{slo.key(k)}: unknown SLO (expected {', '.join(SLO_NAMES)})")
                    slo.get(k, float, positive=True)
                s.tier_slos[name] = {k: float(v) for k, v in slo.data.items()}
            t.check_unknown()
        if s.tiers and sum(s.tiers.values()) <= 0:
            raise ScenarioError("tiers: the weights sum to 0")

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
                concurrency=load.get("concurrency", int, 0, min_value=0),
            )
        except ValueError as e:
            raise ScenarioError(f"load: {e}") from e
    elif s.workload_type != "trace":
        raise ScenarioError("load.arrival: 'trace' needs workload.type: trace")

    if s.workload_type == "synthetic":
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
        for n in (sp, conv):
            if n:
                n.check_unknown()
    else:
        s.trace_path = _resolve(w.get("path", str), base)
        s.trace_format = w.get("format", (str, type(None)), None, choices=(*FORMATS, None))
        s.trace_options = TraceOptions(
            time_scale=w.get("time_scale", float, 1.0, positive=True),
            rate=load.get("rate", (float, type(None)), None, positive=True) if arrival == "trace" else None,
            start_offset_s=w.get("start_offset_s", float, 0.0, min_value=0.0),
            max_requests=s.requests, max_duration_s=s.duration_s,
            block_size=w.get("block_size", int, 512, min_value=1), seed=s.seed,
            skip_failed=w.get("skip_failed", bool, True), token_range=(lo_hi[0], lo_hi[1]),
            output_len=w.get("output_len", int, 128, min_value=1),
            max_output_len=w.get("max_output_len", (int, type(None)), None, min_value=1),
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
    return s
