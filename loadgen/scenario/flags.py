"""The command line's scenario flags: the SLO, the workload's lengths, a dataset, a shared prefix and the load,
applied to a scenario's YAML before it is validated.

Precedence: the built-in defaults (the ``your-server`` template, when no scenario is named) < the scenario
file < these flags; ``--set KEY=VALUE`` edits the file's values before the flags apply. The flags' rules:

- ``--slo METRIC:MS[@QUANTILE]`` (repeatable; ``ttft``, ``ttfot``, ``tpot``, ``itl``, ``e2el``; ``p50`` …
  ``p99.9``, default the search's quantile, p99; or ``mean``: ``tpot:50@mean``, the YAML form
  ``{threshold: 50, statistic: mean}``) replaces the SLOs of every tier that has some; a scenario
  whose tiers have none gets them on every tier, one with no tiers gets one tier, ``standard``.
- ``--input-len`` / ``--output-len`` take a length (``512``) or a uniform range (``256:1024``);
  ``--dataset FILE`` replaces the workload with a file's prompts (JSONL of ``prompt`` / ``messages``, or
  ShareGPT JSON), sent at the load's arrival process; ``--prefix-len N`` gives the prompts a shared prefix of
  N tokens (``--prefix-share F``: the share of requests that carry it, default all).
- ``--rate``, ``--concurrency`` (a closed loop), ``--duration`` and ``--requests`` set ``load``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from loadgen.scenario.model import ScenarioError

SLO_FLAG_METRICS = {"ttft": "ttft_ms", "ttfot": "ttfot_ms", "tpot": "tpot_ms", "itl": "itl_ms", "e2el": "e2el_ms"}
_SLO_FORM = "METRIC:MS[@pQ|@mean], e.g. ttft:500, tpot:50@p90 or tpot:50@mean"


@dataclass(frozen=True)
class SloFlag:
    """One ``--slo``: a metric's threshold and, when given, its own quantile, or ``statistic="mean"``."""

    metric: str  # ttft_ms | ttfot_ms | tpot_ms | itl_ms | e2el_ms
    threshold_ms: float
    quantile: float | None = None  # None: the tier's, else the search's (p99)
    statistic: str = "quantile"  # quantile | mean (``@mean``)

    def as_yaml(self) -> float | dict[str, Any]:
        if self.statistic == "mean":
            return {"threshold": self.threshold_ms, "statistic": "mean"}
        if self.quantile is None:
            return self.threshold_ms
        return {"threshold": self.threshold_ms, "quantile": self.quantile}


def parse_slo(text: str) -> SloFlag:
    """``ttft:500`` / ``tpot:50@p90`` / ``e2el:2000@p99.9`` / ``tpot:50@mean``; a ScenarioError naming the
    flag otherwise."""
    name, sep, rest = text.strip().partition(":")
    if not sep:
        raise ScenarioError(f"--slo {text!r}: expected {_SLO_FORM}")
    metric = SLO_FLAG_METRICS.get(name.strip().lower())
    if metric is None:
        raise ScenarioError(f"--slo {text!r}: unknown metric {name!r} (expected one of {', '.join(SLO_FLAG_METRICS)})")
    value, at, q_text = rest.partition("@")
    try:
        threshold = float(value)
    except ValueError:
        raise ScenarioError(f"--slo {text!r}: {value!r} is not a number of milliseconds ({_SLO_FORM})") from None
    if not 0 < threshold < float("inf"):
        raise ScenarioError(f"--slo {text!r}: the threshold must be a positive number of milliseconds")
    if at and q_text.strip().lower() == "mean":
        return SloFlag(metric, threshold, None, "mean")
    quantile = parse_quantile(q_text, f"--slo {text!r}") if at else None
    return SloFlag(metric, threshold, quantile)


def parse_quantile(text: str, what: str) -> float:
    """``p99`` -> 0.99, ``p99.9`` -> 0.999, ``p50`` -> 0.5 (``mean`` is ``parse_slo``'s: no quantile)."""
    m = re.fullmatch(r"[pP](\d{1,2}(?:\.\d+)?)", text.strip())
    if not m or not 0 < float(m.group(1)) < 100:
        raise ScenarioError(f"{what}: expected a quantile p50 ... p99.9 (or mean) after '@', found {text!r}")
    return round(float(m.group(1)) / 100.0, 10)


def parse_length(text: str, flag: str) -> int | dict[str, Any]:
    """``512`` -> 512; ``256:1024`` -> a uniform length distribution from 256 to 1024 tokens."""
    lo, sep, hi = text.strip().partition(":")
    try:
        a = int(lo)
        b = int(hi) if sep else a
    except ValueError:
        raise ScenarioError(f"{flag} {text!r}: expected a token count (512) or a range MIN:MAX (256:1024)") from None
    if a < 1 or b < a:
        raise ScenarioError(f"{flag} {text!r}: expected 1 <= MIN <= MAX tokens")
    return a if a == b else {"dist": "uniform", "min": a, "max": b}


@dataclass
class ScenarioFlags:
    """The scenario flags of ``run`` and ``capacity`` (None / empty: not given)."""

    slos: list[SloFlag] = field(default_factory=list)
    input_len: str | None = None
    output_len: str | None = None
    dataset: Path | None = None
    prefix_len: int | None = None
    prefix_share: float | None = None
    rate: float | None = None
    concurrency: int | None = None
    duration_s: float | None = None
    requests: int | None = None

    def apply(self, raw: Any) -> dict[str, Any]:
        """The scenario's YAML mapping with these flags applied (a new top level; nested sections edited)."""
        raw = dict(raw or {})
        if self.slos:
            raw["tiers"] = self._tiers(raw.get("tiers"))
        if any(v is not None for v in (self.input_len, self.output_len, self.dataset, self.prefix_len,
                                       self.prefix_share)):
            raw["workload"] = self._workload(raw.get("workload"))
            if self.dataset is not None:
                load = dict(raw.get("load") or {})
                if load.get("arrival") in (None, "trace"):
                    load["arrival"] = "poisson"  # a dataset has no timestamps: the load's process sends it
                raw["load"] = load
        if any(v is not None for v in (self.rate, self.concurrency, self.duration_s, self.requests)):
            raw["load"] = self._load(raw.get("load"))
        return raw

    def _tiers(self, tiers: Any) -> dict[str, Any]:
        slo = {s.metric: s.as_yaml() for s in self.slos}
        if not isinstance(tiers, dict) or not tiers:
            return {"standard": {"weight": 1, "slo": slo}}
        out = {name: dict(t or {}) for name, t in tiers.items()}
        with_slo = [name for name, t in out.items() if t.get("slo")]
        for name in with_slo or list(out):
            quantile = (out[name].get("slo") or {}).get("quantile")
            out[name]["slo"] = {**slo, **({"quantile": quantile} if quantile is not None else {})}
        return out

    def _workload(self, w: Any) -> dict[str, Any]:
        w = dict(w or {})
        if self.dataset is not None:
            if self.input_len is not None:
                raise ScenarioError("--input-len: a --dataset brings its own prompts (give one or the other)")
            if self.prefix_len is not None or self.prefix_share is not None:
                raise ScenarioError("--prefix-len: a --dataset brings its own prompts (give one or the other)")
            kept = {k: w[k] for k in ("cancel", "token_range") if k in w}
            w = {"type": "trace", "path": str(self.dataset), **kept}
            if self.output_len is not None:
                out = parse_length(self.output_len, "--output-len")
                if not isinstance(out, int):
                    raise ScenarioError("--output-len: with --dataset, one number (the answers' max_tokens where the "
                                        "dataset has none)")
                w["output_len"] = out
            return w
        if w.get("type", "synthetic") != "synthetic":
            flag = next(f for f, v in (("--input-len", self.input_len), ("--output-len", self.output_len),
                                       ("--prefix-len", self.prefix_len), ("--prefix-share", self.prefix_share))
                        if v is not None)
            raise ScenarioError(f"{flag}: the scenario replays a trace, whose requests have their own lengths "
                                "(the flag applies to synthetic workloads)")
        if self.input_len is not None:
            w["input_len"] = parse_length(self.input_len, "--input-len")
        if self.output_len is not None:
            w["output_len"] = parse_length(self.output_len, "--output-len")
        if self.prefix_len is not None or self.prefix_share is not None:
            w["shared_prefix"] = self._prefix(w.get("shared_prefix"))
        return w

    def _prefix(self, sp: Any) -> dict[str, Any]:
        sp = dict(sp or {})
        if self.prefix_len is None and not sp:
            raise ScenarioError("--prefix-share: the workload has no shared prefix (give --prefix-len N)")
        if self.prefix_len is not None:
            if self.prefix_len < 1:
                raise ScenarioError(f"--prefix-len: expected at least 1 token, found {self.prefix_len}")
            sp = {"num_prompts": sp.get("num_prompts", 1), "length": self.prefix_len, "ratio": sp.get("ratio", 1.0)}
        if self.prefix_share is not None:
            if not 0 <= self.prefix_share <= 1:
                raise ScenarioError(f"--prefix-share: expected a fraction in [0, 1], found {self.prefix_share:g}")
            sp["ratio"] = self.prefix_share
        return sp

    def _load(self, load: Any) -> dict[str, Any]:
        load = dict(load or {})
        if self.rate is not None and self.concurrency is not None:
            raise ScenarioError("--rate and --concurrency: give one (an open loop at a rate, or a closed loop of "
                                "N users)")
        if self.rate is not None:
            load["rate"] = self.rate
            if load.get("arrival") == "closed":
                load["arrival"] = "poisson"
            load.pop("concurrency", None)
        if self.concurrency is not None:
            load["arrival"], load["concurrency"] = "closed", self.concurrency
            load.pop("rate", None)
        if self.duration_s is not None:
            load["duration_s"] = self.duration_s
        if self.requests is not None:
            load["requests"] = self.requests
        return load


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
