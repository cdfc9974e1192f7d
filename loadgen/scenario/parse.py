"""Scenario files for ``slobench run``: YAML, validated, errors name the key path, expected and found.

A file with every section is shown in :mod:`loadgen.scenario.model`. One function per section
fills its part of the :class:`~loadgen.scenario.model.Scenario`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from loadgen.results.latency import LATENESS_BOUND_MS
from loadgen.scenario.engine_options import parse_engine_options
from loadgen.scenario.flags import ScenarioFlags, apply_override
from loadgen.scenario.model import ENDPOINTS, SLO_NAMES, Scenario, ScenarioError
from loadgen.scenario.options import ARRIVAL_DESIGNS, AXES, SPENDING, WINDOW_COUNTS, SearchConfig, StepOptions
from loadgen.scenario.schema import MappingNode
from loadgen.scenario.tiers import parse_tiers
from loadgen.workload.arrivals import KINDS as ARRIVAL_KINDS
from loadgen.workload.arrivals import Arrivals
from loadgen.workload.shaping import TraceShaping
from loadgen.workload.specs import DEFAULT_TOKEN_RANGE, CancelMix
from loadgen.workload.synthetic import Conversations, LengthDist, SharedPrefix, SyntheticWorkload
from loadgen.workload.traces import FORMATS, TraceError, TraceOptions, load_length_stats


def load_scenario(path: str | Path, overrides: list[str] | None = None, flags: ScenarioFlags | None = None) -> Scenario:
    """Read and validate a scenario file; ``overrides`` are ``dotted.key=VALUE`` strings (VALUE is YAML)
    applied before validation, so their mistakes are reported like the file's; ``flags`` (the command
    line's ``--slo``, ``--input-len`` ...) apply after them."""
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
    if flags is not None:
        if raw is not None and not isinstance(raw, dict):
            raise ScenarioError(f"{path}: expected a mapping at the top level, found {type(raw).__name__}")
        raw = flags.apply(raw)
    try:
        return parse_scenario(raw, base=path.parent, default_name=path.stem, source=str(path))
    except ScenarioError as e:
        raise ScenarioError(f"{path}: {e}") from None


def parse_scenario(
    raw: Any, base: Path = Path("."), default_name: str = "scenario", source: str = ""
) -> Scenario:
    """A scenario from parsed YAML; relative paths in it are looked up under ``base``, then the working
    folder. The sections are read in a fixed order, so a file with several mistakes reports the same one
    first every time."""
    root = MappingNode(raw if raw is not None else {}, "")
    s = Scenario(name=root.get("name", str, default_name), source=source)
    _parse_top_level(root, s)
    tiers = root.child("tiers", None)
    if tiers:
        parse_tiers(tiers, s)
    srch = root.child("search", None)
    if srch:
        s.search, s.step = _parse_search(srch)
    s.headroom = root.get("headroom", float, 0.2, min_value=0.0)
    if not s.headroom < 1:
        raise ScenarioError(f"headroom: expected a fraction in [0, 1), found {s.headroom!r}")

    load = root.child("load", None) or MappingNode({}, "load")
    s.requests = load.get("requests", (int, type(None)), None, min_value=1)
    s.duration_s = load.get("duration_s", (float, type(None)), None, positive=True)
    w = root.child("workload")
    s.workload_type = w.get("type", str, "synthetic", choices=("synthetic", "trace"))
    token_range = _parse_token_range(w)
    arrival = _parse_arrivals(load, s)  # after workload.type: a trace workload defaults to its own timestamps
    if s.workload_type == "synthetic":
        _parse_synthetic_workload(w, s, arrival, token_range, base)
    else:
        _parse_trace_workload(w, load, s, arrival, token_range, base)
    s.cancel = _parse_cancel(w)
    w.check_unknown()
    load.check_unknown()

    _parse_goodput(root, s)
    c = root.child("client", None)
    if c:
        _parse_client(c, s)
    root.check_unknown()
    if s.search and not any(s.tier_slos.values()):
        raise ScenarioError("tiers: the capacity search needs at least one tier with an SLO, e.g. "
                            "tiers: {standard: {slo: {ttft_ms: 800}}}")
    return s


def _parse_top_level(root: MappingNode, s: Scenario) -> None:
    """seed, target, model and the ``engine`` section."""
    s.seed = root.get("seed", int, 0)
    s.target = root.get("target", (str, type(None)), None)
    if s.target is not None and not s.target.startswith(("http://", "https://")):
        raise ScenarioError(f"target: expected an http(s) URL or null, found {s.target!r}")
    s.model = root.get("model", (str, type(None)), None)
    eng = root.child("engine", None)
    s.engine = parse_engine_options(eng) if eng else {}


def _parse_search(node: MappingNode) -> tuple[SearchConfig, StepOptions]:
    """The ``search`` section: how each step is measured, then how the search moves between steps."""
    axis = node.get("axis", str, "rate", choices=AXES)
    step = StepOptions(
        step_duration_s=node.get("step_duration_s", float, 15.0, positive=True),
        warmup_s=node.get("warmup_s", float, 3.0, min_value=0.0),
        quantile=node.get_quantile("quantile") if "quantile" in node.data else 0.99,
        confidence=node.get("confidence", float, 0.95, positive=True),
        drain_s=node.get("drain_s", (float, type(None)), None, min_value=0.0),
        early_stop=node.get("early_stop", bool, True),
        early_pass=node.get("early_pass", bool, True),
        pass_margin=node.get("pass_margin", float, 0.5, positive=True),
        settle_timeout_s=node.get("settle_timeout_s", float, 30.0, min_value=0.0),
        max_warmup_s=node.get("max_warmup_s", (float, type(None)), None, min_value=0.0),
        steady_interval_s=node.get("steady_interval_s", float, 1.0, positive=True),
        steady_tolerance=node.get("steady_tolerance", float, 0.1, min_value=0.0),
        alpha=node.get("alpha", float, 0.05, positive=True),
        alpha_spending=node.get("alpha_spending", str, "pocock", choices=SPENDING),
        look_interval_s=node.get("look_interval_s", float, 0.5, positive=True),
        decluster_run=node.get("decluster_run", int, 2, min_value=0),
        min_samples=node.get("min_samples", (int, type(None)), None, min_value=0),
        max_step_duration_s=node.get("max_step_duration_s", (float, type(None)), None, positive=True),
    )
    if step.max_step_duration_s < step.step_duration_s:
        raise ScenarioError(f"search.max_step_duration_s: expected at least step_duration_s "
                            f"({step.step_duration_s:g}), found {step.max_step_duration_s:g}")
    if not step.warmup_s < step.step_duration_s:
        raise ScenarioError(f"search.warmup_s: expected less than step_duration_s ({step.step_duration_s:g}), "
                            f"found {step.warmup_s:g}")
    if not step.warmup_s <= step.max_warmup_s < step.step_duration_s:
        raise ScenarioError(f"search.max_warmup_s: expected at least warmup_s ({step.warmup_s:g}) and less than "
                            f"step_duration_s ({step.step_duration_s:g}), found {step.max_warmup_s:g}")
    if not step.alpha < 0.5:
        raise ScenarioError(f"search.alpha: expected an error rate in (0, 0.5), found {step.alpha!r}")
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
              max_load=node.get("max_load", (float, type(None)), None, positive=True),
              arrivals=node.get("arrivals", str, "fresh", choices=ARRIVAL_DESIGNS),
              window_counts=node.get("window_counts", str, "drawn", choices=WINDOW_COUNTS),
              refine_steps=node.get("refine_steps", int, 0, min_value=0),
              max_duration_s=node.get("max_duration_s", (float, type(None)), None, positive=True))
    node.check_unknown()
    try:
        cfg = SearchConfig(**kw)
    except ValueError as e:
        raise ScenarioError(f"search: {e}") from None
    return cfg, step


def _parse_arrivals(load: MappingNode, s: Scenario) -> str:
    """``load.arrival`` and its process (``s.arrivals``, None for a trace's own timestamps); returns the
    arrival kind, ``trace`` included."""
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
    return arrival


def _parse_token_range(w: MappingNode) -> tuple[int, int]:
    lo_hi = w.get("token_range", list, list(DEFAULT_TOKEN_RANGE))
    if len(lo_hi) != 2 or not all(isinstance(x, int) for x in lo_hi) or not 0 <= lo_hi[0] < lo_hi[1]:
        raise ScenarioError(f"workload.token_range: expected [lo, hi] with 0 <= lo < hi, found {lo_hi}")
    return lo_hi[0], lo_hi[1]


def _parse_synthetic_workload(w: MappingNode, s: Scenario, arrival: str, token_range: tuple[int, int],
                              base: Path) -> None:
    if s.requests is None and s.duration_s is None and s.search:
        s.duration_s = s.step.step_duration_s  # `slobench run` on a capacity scenario: one step's worth
        if arrival == "closed":
            s.requests = 100
    if s.requests is None and (s.duration_s is None or arrival == "closed"):
        raise ScenarioError("load.requests: required (or load.duration_s for open-loop arrivals)")
    sp = w.child("shared_prefix", None)
    conv = w.child("conversations", None)
    s.synthetic = SyntheticWorkload(
        input_len=_parse_length(w, "input_len", 128, base),
        output_len=_parse_length(w, "output_len", 64, base),
        shared_prefix=SharedPrefix(
            sp.get("num_prompts", int, 1, min_value=1), sp.get("length", int, 256, min_value=1),
            sp.get("ratio", float, 1.0, min_value=0.0),
        ) if sp else None,
        conversations=Conversations(
            conv.get("turns", int, 3, min_value=1), conv.get("think_time_s", float, 2.0, min_value=0.0),
            conv.get("answer_tokens", int, 32, min_value=0),
            conv.get("history", str, "real", choices=Conversations.HISTORIES),
        ) if conv else None,
        tiers=s.tiers, token_range=token_range, ignore_eos=w.get("ignore_eos", bool, True),
    )
    if w.data.get("ignore_eos") is True:  # asked for in the file: a target that rejects it is an error
        s.explicit_fields.add("ignore_eos")
    if sp and not sp.data.get("ratio", 1.0) <= 1:
        raise ScenarioError(f"workload.shared_prefix.ratio: expected a fraction in [0, 1], "
                            f"found {sp.data['ratio']!r}")
    for n in (sp, conv):
        if n:
            n.check_unknown()


def _parse_cancel(w: MappingNode) -> CancelMix | None:
    """``workload.cancel: {ratio, after_tokens | after_s}``: the client cancellation mix."""
    c = w.child("cancel", None)
    if c is None:
        return None
    ratio = c.get("ratio", float, min_value=0.0)
    if not ratio <= 1:
        raise ScenarioError(f"{c.key('ratio')}: expected a fraction in [0, 1], found {ratio!r}")
    tokens = c.get("after_tokens", (int, type(None)), None, min_value=1)
    after_s = c.get("after_s", (float, type(None)), None, positive=True)
    if (tokens is None) == (after_s is None):
        raise ScenarioError(f"{c.path}: expected exactly one of after_tokens or after_s, found "
                            f"{'both' if tokens is not None else 'neither'}")
    c.check_unknown()
    return CancelMix(ratio, tokens, after_s)


def _parse_length(node: MappingNode, k: str, default: int, base: Path) -> LengthDist:
    """A length: a number (fixed) or a distribution mapping; ``empirical`` takes ``values`` or the lengths
    of a trace (``from: PATH, column: input|output``)."""
    v = node.data.get(k)
    node.used.add(k)
    if v is None:
        return LengthDist("fixed", value=default)
    if isinstance(v, int) and not isinstance(v, bool):
        if v < 1:
            raise ScenarioError(f"{node.key(k)}: expected a length >= 1, found {v}")
        return LengthDist("fixed", value=v)
    d = MappingNode(v, node.key(k))
    dist = d.get("dist", str, choices=LengthDist.KINDS)
    kw: dict[str, Any] = {"dist": dist}
    for name, t in (("value", int), ("min", int), ("max", int), ("mean", float), ("std", float),
                    ("sigma", float)):
        if name in d.data:
            kw[name] = d.get(name, t)
    if dist == "empirical":
        if "from" in d.data:
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


def _parse_trace_workload(w: MappingNode, load: MappingNode, s: Scenario, arrival: str,
                          token_range: tuple[int, int], base: Path) -> None:
    s.trace_path = _resolve(w.get("path", str), base)
    if not s.trace_path.is_file():
        raise ScenarioError(f"workload.path: expected a trace file, found no file at {s.trace_path}")
    s.trace_format = w.get("format", (str, type(None)), None, choices=(*FORMATS, None))
    s.shaping = TraceShaping(
        input_scale=w.get("input_scale", float, 1.0, positive=True),
        output_scale=w.get("output_scale", float, 1.0, positive=True),
        max_input_len=w.get("max_input_len", (int, type(None)), None, min_value=1),
        max_output_len=w.get("max_output_len", (int, type(None)), None, min_value=1),
        spread_ties_s=w.get("spread_ties_s", float, 0.0, min_value=0.0),
    )
    s.trace_options = TraceOptions(
        time_scale=w.get("time_scale", float, 1.0, positive=True),
        rate=load.get("rate", (float, type(None)), None, positive=True) if arrival == "trace" else None,
        start_offset_s=w.get("start_offset_s", float, 0.0, min_value=0.0),
        max_requests=s.requests, max_duration_s=s.duration_s,
        block_size=w.get("block_size", int, 512, min_value=1), seed=s.seed,
        skip_failed=w.get("skip_failed", bool, True), token_range=token_range,
        output_len=w.get("output_len", int, 128, min_value=1),
        arrivals=s.arrivals, tiers=s.tiers,
    )


def _parse_goodput(root: MappingNode, s: Scenario) -> None:
    """``goodput``: SLO thresholds (ms) a request must meet to count as goodput."""
    g = root.data.get("goodput")
    root.used.add("goodput")
    if g is not None:
        gn = MappingNode(g, "goodput")
        for k in list(gn.data):
            if k not in SLO_NAMES:
                raise ScenarioError(f"goodput.{k}: unknown SLO (expected {', '.join(SLO_NAMES)})")
            s.goodput[k] = gn.get(k, float, positive=True)


def _parse_client(c: MappingNode, s: Scenario) -> None:
    s.max_connections = c.get("max_connections", int, 0, min_value=0)
    s.read_timeout_s = c.get("read_timeout_s", (float, type(None)), 300.0, positive=True)
    s.workers = c.get("workers", int, 1, min_value=1)
    s.lateness_bound_ms = c.get("lateness_bound_ms", float, LATENESS_BOUND_MS, positive=True)
    s.send_tier = c.get("send_tier", (bool, type(None)), None)
    if s.send_tier:
        s.explicit_fields.add("service_tier")
    s.send_priority = c.get("send_priority", (bool, type(None)), None)
    s.retries = c.get("retries", int, 0, min_value=0)
    s.retry_max_wait_s = c.get("retry_max_wait_s", float, 30.0, positive=True)
    if s.send_priority:
        s.explicit_fields.add("priority")
    s.endpoint = c.get("endpoint", (str, type(None)), None, choices=(*ENDPOINTS, None))
    s.continuous_usage = c.get("continuous_usage", (bool, type(None)), None)
    c.check_unknown()


def _resolve(p: str, base: Path) -> Path:
    """A path as written, relative to the scenario's folder, else to the working folder, else (so the
    error names it) to the scenario's folder."""
    path = Path(p).expanduser()
    if path.is_absolute():
        return path
    for root in (base, Path.cwd()):
        if (root / path).exists():
            return root / path
    return base / path
