"""A capacity run's figures against offered load: throughput, every latency's p50 / p99 per tier, the
rating's evidence (each window's share of requests over each SLO, the fits, the crossing and the interval),
and the latency distributions at the rated load and at the first failing one.

Each builder returns a ``go.Figure``, or ``None`` when the run has nothing for it (the page then says why).
"""

from __future__ import annotations

import math
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from loadgen.capacity.headline import interval_span
from loadgen.report import data as d
from loadgen.report.evidence import SLOEvidence
from loadgen.report.plots import LAYOUT, PALETTE, figure, tier_colors, tier_sort
from loadgen.report.step_metrics import METRICS, ReferenceSteps, StepFigures, metric_values
from loadgen.results.slo import slo_label

TITLES = {"throughput": "Throughput against offered load", "latency": "Latency against offered load",
          "evidence": "The rating's evidence: requests over each SLO against offered load"}
DIST_TITLES = {"ttft": "TTFT", "itl": "Inter-token latency", "tpot": "TPOT", "e2el": "E2E latency"}
SYMBOL = {True: "circle", False: "x", None: "diamond-open"}
CAP_FACTOR = 5.0  # the evidence plot shows shares up to this many times the largest SLO level (more: at the top)


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


def _g(x: float | None) -> str:
    return "–" if x is None else f"{x:.4g}"


def x_label(run: d.RunData) -> str:
    axis, _ = d.load_axis(run)
    return "users (concurrency)" if axis == "concurrency" else "offered load (req/s)"


def slo_list(run: d.RunData) -> list[tuple[str, dict[str, Any]]]:
    """Every SLO of the run as (tier, {metric, quantile, threshold_ms}): ``slos``, else ``slo``."""
    s = run.summary
    out = []
    if isinstance(s.get("slos"), dict):
        for tier, ss in s["slos"].items():
            out += [(str(tier), x) for x in ss or [] if isinstance(x, dict) and _num(x.get("threshold_ms"))]
    elif isinstance(s.get("slo"), dict):
        out = [(str(t), x) for t, x in s["slo"].items() if isinstance(x, dict) and _num(x.get("threshold_ms"))]
    return out


def _rated_lines(f: go.Figure, run: d.RunData, **where) -> None:
    """The rated capacity (offered) and, when known, the spec capacity, as vertical lines."""
    rated, spec = d.rated_load(run)
    if _num(rated) is not None:
        bound = "≥ " if (run.summary.get("rated_capacity") or {}).get("lower_bound") else ""
        f.add_vline(x=rated, line=dict(color="#000", width=2), annotation_text=f"rated {bound}{rated:.4g}",
                    annotation_position="top right", **where)
    if _num(spec) is not None:
        f.add_vline(x=spec, line=dict(color="#000", width=1, dash="dot"), annotation_text=f"spec {spec:.4g}",
                    annotation_position="bottom right", **where)


def _hover(s: StepFigures) -> str:
    verdict = {True: "pass", False: "FAIL", None: "-"}[s.passed]
    early = ", stopped early" if s.stopped_early else ""
    return (f"step {s.index} ({s.phase}{early}) {verdict}<br>requested {_g(s.requested)}, "
            f"{s.requests} requests in {_g(s.window_s)} s")


def throughput(run: d.RunData, figs: list[StepFigures]) -> go.Figure | None:
    """Completed requests/s (and goodput) per step against its offered load, the offered = served line,
    and output tokens/s on the right axis; a failing step is an x."""
    pts = [s for s in figs if s.throughput_rps is not None or s.output_tok_s is not None]
    if not pts:
        return None
    f = make_subplots(specs=[[{"secondary_y": True}]])
    f.update_layout(meta={"title": TITLES["throughput"]}, **LAYOUT)
    top = max(s.offered for s in pts)
    if d.load_axis(run)[0] != "concurrency":
        f.add_trace(go.Scatter(x=[0, top], y=[0, top], mode="lines", name="served = offered",
                               line=dict(color="#aaa", dash="dot", width=1), hoverinfo="skip"), secondary_y=False)
    series = (("throughput_rps", "completed req/s", PALETTE[0], False, 12),  # goodput drawn smaller, inside it
              ("goodput_rps", "goodput req/s (met every SLO)", PALETTE[2], False, 7),
              ("output_tok_s", "output tok/s", PALETTE[4], True, 9))
    for key, name, color, right, size in series:
        rows = [s for s in pts if getattr(s, key) is not None]
        if not rows:
            continue
        f.add_trace(go.Scatter(
            x=[s.offered for s in rows], y=[getattr(s, key) for s in rows], mode="markers", name=name,
            text=[_hover(s) for s in rows],
            marker=dict(color=color, size=size, symbol=[SYMBOL[s.passed] + ("-open" if s.stopped_early and
                                                                         s.passed is not None else "")
                                                     for s in rows]),
            hovertemplate="%{x:.4g}: %{y:.4g}<br>%{text}<extra>" + name + "</extra>"), secondary_y=right)
    _rated_lines(f, run)
    f.update_xaxes(title_text=x_label(run), rangemode="tozero")
    f.update_yaxes(title_text="requests/s", rangemode="tozero", secondary_y=False)
    f.update_yaxes(title_text="output tokens/s", rangemode="tozero", showgrid=False, secondary_y=True)
    return f


def latency_vs_load(run: d.RunData, figs: list[StepFigures], ttfot: bool) -> go.Figure | None:
    """p50 (dotted) and p99 (solid) per tier of TTFT, TTFOT (a reasoning model only), TPOT, ITL and E2E
    latency against offered load, one panel each, with the SLO thresholds and the rated capacity."""
    metrics = [(k, label) for k, label in METRICS if k != "ttfot" or ttfot]
    tiers = tier_sort({t for s in figs for t in s.tiers})
    if not tiers or not any(s.tiers[t][k]["p50"] is not None for s in figs for t in s.tiers for k, _ in metrics):
        return None
    colors = tier_colors(tiers)
    f = make_subplots(rows=len(metrics), cols=1, shared_xaxes=True, vertical_spacing=0.06,
                      subplot_titles=[f"{label} (ms)" for _, label in metrics])
    for row, (key, _label) in enumerate(metrics, start=1):
        for tier in tiers:
            for q, dash in (("p50", "dot"), ("p99", "solid")):
                rows = [s for s in figs if tier in s.tiers and s.tiers[tier][key][q] is not None]
                if not rows:
                    continue
                name = f"{tier} {q}"
                f.add_trace(go.Scatter(x=[s.offered for s in rows], y=[s.tiers[tier][key][q] for s in rows],
                                       mode="lines+markers", name=name, legendgroup=name, showlegend=row == 1,
                                       text=[_hover(s) for s in rows],
                                       line=dict(color=colors[tier], dash=dash, width=1.5),
                                       marker=dict(size=6, symbol=[SYMBOL[s.passed] for s in rows]),
                                       hovertemplate="%{x:.4g}: %{y:.4g} ms<br>%{text}<extra>" + name + "</extra>"),
                            row=row, col=1)
        lines = [(tier, slo) for tier, slo in slo_list(run) if str(slo.get("metric", "")).removesuffix("_ms") == key]
        for k, (tier, slo) in enumerate(lines):  # labels alternately left and right: close thresholds' would overlap
            thr = float(slo["threshold_ms"])
            judged = " (judged on each request's longest gap)" if key == "itl" else ""
            f.add_hline(y=thr, line=dict(color=colors.get(tier, "#555"), dash="dash", width=1), row=row, col=1,
                        annotation_text=f"{tier} SLO {slo_label(slo)} ≤ {thr:g} ms{judged}",
                        annotation_position="top left" if k % 2 == 0 else "top right")
    rated, _ = d.rated_load(run)
    if _num(rated) is not None:
        f.add_vline(x=rated, line=dict(color="#000", width=1.5), row="all", col=1)
        f.add_annotation(x=rated, y=1.0, xref="x", yref="y domain", yanchor="top", xanchor="left", xshift=3,
                         showarrow=False, text=f"rated {rated:.4g}", font=dict(size=11),
                         bgcolor="rgba(255,255,255,0.7)")
    f.update_xaxes(title_text=x_label(run), row=len(metrics), col=1)
    f.update_yaxes(rangemode="tozero")
    f.update_layout(meta={"title": TITLES["latency"]},
                    **{**LAYOUT, "height": 240 * len(metrics) + 80, "margin": dict(l=60, r=20, t=60, b=50)})
    return f


def evidence(run: d.RunData, evs: list[SLOEvidence], iv: dict[str, Any] | None) -> go.Figure | None:
    """Each counted window's share of requests over each SLO's threshold (size: its requests; x: it broke
    the SLO; a triangle: more than the axis shows) against the load the rating places it at, the isotonic
    (dotted) and logistic (solid) fits, the level each SLO allows, the crossings, the interval (band) and
    the rating's estimate, on a log load axis (the fits are in log load)."""
    if not evs:
        return None
    top = 100.0 * min(1.0, CAP_FACTOR * max(e.level for e in evs))
    loads = [w.load for e in evs for w in e.windows]
    ticks = [m * 10 ** k for k in range(-2, 7) for m in (1, 2, 5)
             if min(loads) / 1.5 <= m * 10 ** k <= max(loads) * 1.5]
    f = figure(TITLES["evidence"], xaxis_title=x_label(run) + ", as the rating places each window (log)",
               yaxis_title="requests over the threshold (%)", xaxis_type="log", yaxis_range=[-0.03 * top, top * 1.04],
               xaxis_tickvals=ticks, xaxis_ticktext=[f"{t:g}" for t in ticks], height=500,
               margin=dict(l=60, r=20, t=80, b=50), legend={**LAYOUT["legend"], "y": 1.08})
    nmax = max(w.n for e in evs for w in e.windows)
    for k, e in enumerate(evs):
        color = PALETTE[k % len(PALETTE)]
        ys = [100.0 * w.share for w in e.windows]
        f.add_trace(go.Scatter(
            x=[w.load for w in e.windows], y=[min(y, top) for y in ys], mode="markers", name=f"{e.name} windows",
            legendgroup=e.name,
            text=[f"step {w.index} ({w.phase}): {w.over:g} of {w.n:g} over {e.threshold_ms:g} ms ({y:.3g}%)"
                  for w, y in zip(e.windows, ys, strict=True)],
            marker=dict(color=color, opacity=0.8, size=[7 + 11 * math.sqrt(w.n / nmax) for w in e.windows],
                        symbol=["triangle-up" if y > top else SYMBOL[w.passed] for w, y in zip(e.windows, ys,
                                                                                               strict=True)]),
            hovertemplate="%{x:.4g} req/s<br>%{text}<extra></extra>"))
        f.add_trace(go.Scatter(x=e.iso_x, y=[min(100.0 * y, top) for y in e.iso_y], mode="lines",
                               name=f"{e.name} isotonic fit", line=dict(color=color, dash="dot", width=1),
                               legendgroup=e.name, showlegend=False, hoverinfo="skip"))
        if e.curve_x:
            f.add_trace(go.Scatter(x=e.curve_x, y=[min(100.0 * y, top) for y in e.curve_y], mode="lines",
                                   name=f"{e.name} logistic fit ({e.fit_windows} windows)", legendgroup=e.name,
                                   line=dict(color=color, width=2.5), hoverinfo="skip"))
        # an open end is no crossing: an arrow at the last (first) load tried, pointing where it may be
        label = {"above": f"holds up to {e.crossing:.4g} (no crossing)",
                 "below": f"broken from {e.crossing:.4g} (no crossing)"}.get(e.open or "", f"crossing {e.crossing:.4g}")
        symbol = {"above": "triangle-right", "below": "triangle-left"}.get(e.open or "", "diamond")
        f.add_trace(go.Scatter(x=[e.crossing], y=[100.0 * e.level], mode="markers", name=f"{e.name} {label}",
                               legendgroup=e.name,
                               marker=dict(color=color, size=13, symbol=symbol, line=dict(color="#000", width=1)),
                               hovertemplate="crossing %{x:.4g}<extra>" + e.fit + " fit</extra>"))
    levels: dict[float, list[str]] = {}  # one line per level: SLOs of one quantile share it
    for e in evs:
        levels.setdefault(round(100.0 * e.level, 9), []).append(f"{e.name} {e.threshold_ms:g} ms")
    for level, names in levels.items():
        f.add_hline(y=level, line=dict(color="#444", dash="dash", width=1), annotation_position="top left",
                    annotation_text=f"{level:g}% may be over the threshold: {', '.join(names)}")
    # on a log axis plotly places shapes in data units but annotations in log10 units: each is added apart
    if iv and (iv.get("ci_low") or 0) > 0 and (iv.get("ci_high") or 0) > 0:
        conf = f"{100 * iv['confidence']:g}% " if iv.get("confidence") else ""
        f.add_vrect(x0=iv["ci_low"], x1=iv["ci_high"], fillcolor="#888", opacity=0.15, line_width=0)
        f.add_annotation(x=math.log10(math.sqrt(iv["ci_low"] * iv["ci_high"])), y=0.72, yref="paper",
                         text=f"{conf}interval<br>{interval_span(iv, lambda x: f'{x:.4g}')}", showarrow=False,
                         bgcolor="rgba(255,255,255,0.8)", font=dict(size=11))
    rated, _ = d.rated_load(run)
    marks = [(iv["estimate"] if iv else None, f"estimate {iv['estimate']:.4g}" if iv else "", "#555", "dash", 1.5),
             (_num(rated), f"rated {_num(rated) or 0:.4g}", "#000", "solid", 2.0)]
    # the two labels either side of their lines, the lower load's to its left
    order = sorted((m for m in marks if m[0] is not None and m[0] > 0), key=lambda m: m[0])
    for k, (x, text, color, dash, width) in enumerate(order):
        f.add_vline(x=x, line=dict(color=color, width=width, dash=dash))
        f.add_annotation(x=math.log10(x), y=1.0, yref="paper", yanchor="bottom", text=text, showarrow=False,
                         xanchor="right" if k == 0 and len(order) > 1 else "left", font=dict(size=11, color=color))
    return f


def distribution(run: d.RunData, refs: list[ReferenceSteps], what: str) -> go.Figure | None:
    """The CDF of one latency per tier at the rated load (solid) and the first failing one (dashed), from
    those steps' judged windows (successful requests), with the SLO thresholds of that latency."""
    if not refs:
        return None
    tiers = tier_sort({str(r.get("tier") or "none") for ref in refs for r in ref.records})
    colors = tier_colors(tiers)
    unit = "fraction of token gaps" if what == "itl" else "fraction of successful requests"
    # the legend inside, bottom right, where a CDF has nothing to draw (above, its rows would cover the top)
    f = figure(f"{DIST_TITLES[what]} at the rated and first failing loads", xaxis_title=f"{DIST_TITLES[what]} (ms)",
               yaxis_title=unit, yaxis_range=[0, 1.01], margin=dict(l=60, r=20, t=20, b=50),
               legend=dict(x=0.99, xanchor="right", y=0.02, yanchor="bottom", bgcolor="rgba(255,255,255,0.85)",
                           bordercolor="#ddd", borderwidth=1, font=dict(size=11)))
    drawn, counts = 0, {}
    for ref, dash in zip(refs, ("solid", "dash"), strict=False):
        counts[ref.label] = len(ref.records)
        for tier in tiers:
            recs = [r for r in ref.records if str(r.get("tier") or "none") == tier]
            xs, ys = d.ecdf(metric_values(recs, what))
            if not xs:
                continue
            drawn += 1
            ok = sum(1 for r in recs if r.get("status") == "ok")
            name = f"{ref.label} {_g(ref.offered)} · {tier} ({ok} of {len(recs)} ok)"
            f.add_trace(go.Scatter(x=xs, y=ys, mode="lines", name=name, line=dict(color=colors[tier], dash=dash,
                                                                                  shape="hv"),
                                   hovertemplate="%{x:.2f} ms: %{y:.3f}<extra>" + name + "</extra>"))
    if not drawn:
        return None
    for tier, slo in slo_list(run):  # in the legend, not as labels: those would sit on the curves' tops
        if what != "itl" and str(slo.get("metric", "")).removesuffix("_ms") == what:
            thr = float(slo["threshold_ms"])
            f.add_trace(go.Scatter(x=[thr, thr], y=[0, 1.01], mode="lines", hoverinfo="skip",
                                   name=f"{tier} SLO {slo_label(slo)} ≤ {thr:g} ms",
                                   line=dict(color=colors.get(tier, "#555"), dash="dashdot", width=1)))
    f.update_layout(meta={"title": f.layout.meta["title"], "records": counts,
                          "steps": {ref.label: ref.steps for ref in refs}})
    return f
