"""What the report page shows of a capacity run beyond the common sections: the figures against offered load,
the rating's evidence, the latency distributions and per-tier percentiles at the rated load and at the first
failing one (never pooled over every load: a capacity run's loads span the whole range, and their pool is no
load anyone runs at)."""

from __future__ import annotations

from typing import Any, Protocol

from loadgen.report import capacity_plots as CP
from loadgen.report import data as d
from loadgen.report import evidence as ev
from loadgen.report import step_metrics as sm

NO_STEPS = "no step with both an offered load and a judged window"


class PlotSink(Protocol):
    def add(self, key: str, title: str, fig, skip: str) -> None: ...


def capacity_sections(run: d.RunData, steps: list[dict[str, Any]], plots: PlotSink) -> dict[str, Any]:
    """Adds the capacity figures to ``plots`` (keys ``throughput``, ``latency_load``, ``evidence``,
    ``dist_ttft`` / ``dist_itl`` / ``dist_tpot`` / ``dist_e2el``); returns the template's context: the
    reference steps (``refs``) with their per-tier tables, the SLOs' crossings, the first failing load."""
    windows = sm.step_windows(run, steps)
    figs = sm.step_figures(run, steps, windows)
    refs = sm.reference_steps(run, steps, windows)
    ttfot = sm.has_ttfot([r for rs in windows.values() for r in rs])
    evs = ev.slo_evidence(run)
    iv = ev.interval(run)
    plots.add("throughput", CP.TITLES["throughput"], CP.throughput(run, figs), NO_STEPS)
    plots.add("latency_load", CP.TITLES["latency"], CP.latency_vs_load(run, figs, ttfot),
              "no step has a successful request")
    plots.add("evidence", CP.TITLES["evidence"], CP.evidence(run, evs, iv),
              "no step counted its requests over an SLO's threshold (no SLO, or a summary from before the rating)")
    for what, label in CP.DIST_TITLES.items():
        plots.add(f"dist_{what}", label, CP.distribution(run, refs, what),
                  "no rated or failing step with a successful request" if refs else
                  "no rated step and no failing step to draw")
    groups = reference_tables(run, steps, refs)
    fail = next((r for r in refs if r.label == "first failing"), None)
    return {"refs": groups, "evidence": evs, "interval": iv, "ttfot": ttfot,
            "first_fail": {"offered": fail.offered, "requested": fail.requested, "steps": fail.steps} if fail else None}


def reference_tables(run: d.RunData, steps: list[dict[str, Any]], refs: list[sm.ReferenceSteps]
                     ) -> list[dict[str, Any]]:
    """The per-tier tables of the reference steps' windows (with the SLO attainment of their summaries)."""
    by_index = {s["index"]: s for s in steps if isinstance(s.get("index"), int)}
    out = []
    for ref in refs:
        frame = d.records_frame([dict(r) for r in ref.records])
        summaries = [((by_index[i].get("summary") or {}).get("tiers") or {}) for i in ref.steps]
        out.append({"label": ref.label, "steps": ref.steps, "offered": ref.offered, "requested": ref.requested,
                    "records": len(ref.records), "cut": sum(1 for r in ref.records if r.get("status") == "cancelled"),
                    "rows": d.tier_table(run, frame, summaries)})
    return out


def rated_tier_table(run: d.RunData) -> list[dict[str, Any]] | None:
    """A capacity run's per-tier table at its rated load (None without one): what the comparison page
    sets beside another run's, instead of a pool over every load."""
    steps = d.steps(run)
    refs = [r for r in sm.reference_steps(run, steps, sm.step_windows(run, steps)) if r.label == "rated"]
    return reference_tables(run, steps, refs)[0]["rows"] if refs else None
