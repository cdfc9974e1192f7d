"""The scenario's ``tiers`` section: each service tier's weight, SLOs and shed budget, and what its requests
carry to the server (``priority``, ``headers``) and how long the client waits for them (``timeout_s``)."""

from __future__ import annotations

from engine.request.tiers import TIER_NAMES
from loadgen.results.slo import STATISTICS, slo_key
from loadgen.scenario.model import SLO_NAMES, Scenario, ScenarioError
from loadgen.scenario.schema import MappingNode


def parse_tiers(tiers: MappingNode, s: Scenario) -> None:
    """Each tier's weight, SLO thresholds (ms) and its own SLO quantile, if it has one. An SLO's mapping
    form takes its own quantile (``{threshold: 50, quantile: 0.9}``) or ``statistic: mean``
    (``{threshold: 50, statistic: mean}``: the window's mean, kept under the key ``tpot_ms@mean``)."""
    for name in tiers.data:
        if name not in TIER_NAMES:
            raise ScenarioError(f"{tiers.key(str(name))}: unknown service tier (expected one of "
                                f"{', '.join(TIER_NAMES)})")
        t = tiers.child(name)
        s.tiers[name] = t.get("weight", float, 1.0, min_value=0.0)
        if (timeout := t.get("timeout_s", (float, type(None)), None, positive=True)) is not None:
            s.tier_timeout_s[name] = timeout
        if (priority := t.get("priority", (int, type(None)), None)) is not None:
            s.tier_priority[name] = priority
        if (headers := t.child("headers", None)) is not None:
            s.tier_headers[name] = {str(k): headers.get(k, str) for k in list(headers.data)}
            headers.check_unknown()
        slo = t.child("slo", None)
        if slo:
            s.tier_slos[name] = {}
            for k in list(slo.data):
                if k == "quantile":
                    s.tier_quantiles[name] = slo.get_quantile(k)
                    continue
                if k == "max_shed":  # the share of the tier's requests that may be shed unjudged
                    s.tier_max_shed[name] = slo.get(k, float, min_value=0.0)
                    if s.tier_max_shed[name] >= 1.0:
                        raise ScenarioError(f"{slo.key(k)}: expected a share below 1, found {slo.data[k]!r}")
                    continue
                if k not in SLO_NAMES:
                    raise ScenarioError(f"{slo.key(k)}: unknown SLO (expected {', '.join(SLO_NAMES)} "
                                        "or quantile)")
                if isinstance(slo.data[k], dict):  # {threshold: MS, quantile: Q}: this SLO's own quantile
                    own = slo.child(k)  # ... or {threshold: MS, statistic: mean}: an SLO on the mean
                    threshold = own.get("threshold", float, positive=True)
                    statistic = own.get("statistic", str, "quantile", choices=STATISTICS)
                    if statistic == "mean" and "quantile" in own.data:
                        raise ScenarioError(f"{own.key('quantile')}: an SLO on the mean (statistic: mean) has "
                                            "no quantile")
                    if "quantile" in own.data:
                        s.slo_quantiles.setdefault(name, {})[k] = own.get_quantile("quantile")
                    own.check_unknown()
                    s.tier_slos.setdefault(name, {})[slo_key(k, statistic)] = threshold
                else:
                    s.tier_slos.setdefault(name, {})[k] = slo.get(k, float, positive=True)
        t.check_unknown()
    if s.tiers and sum(s.tiers.values()) <= 0:
        raise ScenarioError("tiers: the weights sum to 0")
