"""The report's figures, built with plotly (rendered in the page by the plotly.js bundle inlined once).

Each builder returns a ``go.Figure`` or ``None`` when the run has nothing to show for it (a fixed-load
run has no load axis; a run with no successful request has no latency distribution), and the page says
why instead of drawing an empty frame.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from engine.request.tiers import TIER_RANK, TIERS
from loadgen.report import data as d
from loadgen.report.health import health as health_series
from loadgen.report.health import step_spans
from loadgen.results.slo import slo_label

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")
PARTS = (("mean_queue_ms", "queue", "#9467bd"), ("mean_prefill_ms", "prefill", "#1f77b4"),
         ("mean_network_ms", "network + frontend", "#bcbd22"), ("mean_decode_ms", "decode", "#2ca02c"))
LAYOUT = dict(template="plotly_white", height=420, margin=dict(l=60, r=20, t=40, b=50),
              legend=dict(orientation="h", yanchor="bottom", y=1.02, xanchor="left", x=0))



def tier_sort(tiers) -> list[str]:
    return sorted(tiers, key=lambda t: (TIER_RANK.get(t, len(TIERS)), t))


def tier_colors(tiers) -> dict[str, str]:
    return {t: PALETTE[i % len(PALETTE)] for i, t in enumerate(tier_sort(tiers))}


def figure(title: str, **layout) -> go.Figure:
    f = go.Figure()  # the page's section heading is the title; ``title`` names the figure for screen readers
    f.update_layout(meta={"title": title}, **{**LAYOUT, **layout})
    return f


def _num(x) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def load_vs_ttft(run: d.RunData, steps: list[dict]) -> go.Figure | None:
    """p50 and p99 TTFT per tier against the load of each step, with the SLO lines and rated capacity."""
    pts = [s for s in steps if _num(s.get("load")) is not None]
    if len(pts) < 2 and not run.is_capacity:
        return None
    if not pts:
        return None
    pts.sort(key=lambda s: s["load"])
    _, xlabel = d.load_axis(run)
    tiers = tier_sort({t for s in pts for t in (s.get("tiers") or {})})
    colors = tier_colors(tiers)
    f = figure("TTFT against load", xaxis_title=xlabel, yaxis_title="TTFT (ms)")
    for tier in tiers:
        rows = [(s["load"], (s["tiers"] or {}).get(tier) or {}, s) for s in pts]
        for q, dash in (("p50", "dot"), ("p99", "solid")):
            xs, ys, text = [], [], []
            for load, e, s in rows:
                y = _num(e.get(f"{q}_ttft_ms"))
                if y is None:
                    continue
                xs.append(load)
                ys.append(y)
                verdict = {True: "pass", False: "FAIL", None: "-"}[e.get("passed")]
                text.append(f"step {s.get('index')} ({s.get('phase', '')}) {verdict}")
            if xs:
                f.add_trace(go.Scatter(x=xs, y=ys, mode="lines+markers", name=f"{tier} {q}", text=text,
                                       line=dict(color=colors[tier], dash=dash),
                                       hovertemplate="%{x:.3g}: %{y:.1f} ms<br>%{text}<extra>%{fullData.name}"
                                                     "</extra>"))
        lo = [(s["load"], _num(((s["tiers"] or {}).get(tier) or {}).get("ci_low_ms")),
               _num(((s["tiers"] or {}).get(tier) or {}).get("ci_high_ms"))) for s in pts]
        lo = [r for r in lo if r[1] is not None and r[2] is not None]
        if lo:
            f.add_trace(go.Scatter(x=[r[0] for r in lo], y=[(r[1] + r[2]) / 2 for r in lo], mode="markers",
                                   marker=dict(size=1, color=colors[tier]), showlegend=False, hoverinfo="skip",
                                   error_y=dict(type="data", symmetric=False,
                                                array=[(r[2] - r[1]) / 2 for r in lo],
                                                arrayminus=[(r[2] - r[1]) / 2 for r in lo], color=colors[tier])))
    for tier, slo in (run.summary.get("slo") or {}).items():
        thr = _num(slo.get("threshold_ms")) if isinstance(slo, dict) else None
        if thr is not None:
            f.add_hline(y=thr, line=dict(color=colors.get(str(tier), "#555"), dash="dash", width=1),
                        annotation_text=f"{tier} SLO {slo_label(slo)} ≤ {thr:g} ms",
                        annotation_position="top left")
    rated, spec = d.rated_load(run)
    if _num(rated) is not None:
        bound = "≥ " if (run.summary.get("rated_capacity") or {}).get("lower_bound") else ""
        f.add_vline(x=rated, line=dict(color="#000", width=2), annotation_text=f"rated {bound}{rated:.3g}",
                    annotation_position="top right")
    if _num(spec) is not None:
        f.add_vline(x=spec, line=dict(color="#000", width=1, dash="dot"), annotation_text=f"spec {spec:.3g}",
                    annotation_position="bottom right")
    return f


def prediction(run: d.RunData) -> go.Figure | None:
    """``slobench plan``'s predicted SLO quantiles against load (a line per predictor and SLO: theory dotted,
    calibrated solid) beside the measured steps' judged quantiles (circle: pass, x: fail), the SLO lines
    and the predicted and measured ratings, over the measured steps' loads and up to 2.5x the largest SLO;
    a value above that (or a failed request's inf) sits at the top edge."""
    pred = run.prediction
    if not pred:
        return None
    slos = {t: [s for s in ss if isinstance(s, dict)] for t, ss in (pred.get("slos") or {}).items()}
    colors = tier_colors(slos)
    f = figure("Predicted and measured SLO quantiles against load", xaxis_title="load (requests/s)",
             yaxis_title="ms (the top edge: more, or failed)")

    top = max((_num(s.get("threshold_ms")) or 0.0 for ss in slos.values() for s in ss), default=0.0)

    def capped(v, thr: float) -> float | None:  # at the top edge: over 2.5x the largest SLO, or failed (inf)
        v = _num(v)
        return None if v is None else min(v, 2.45 * top if top else 10 * thr)

    for tier, ss in slos.items():
        for s in ss:
            metric, thr = str(s.get("metric")), _num(s.get("threshold_ms")) or 0.0
            label = f"{tier} {slo_label(s)} {metric[:-3].upper()}"
            for name, p in (pred.get("predicted") or {}).items():
                pts = [(q["load"], capped(((q.get("quantiles_ms") or {}).get(tier) or {}).get(metric), thr))
                       for q in p.get("curve") or [] if _num(q.get("load")) is not None]
                pts = [(x, y) for x, y in pts if y is not None]
                if pts:
                    f.add_trace(go.Scatter(x=[x for x, _ in pts], y=[y for _, y in pts], mode="lines",
                                           name=f"{name}: {label}", line=dict(color=colors[tier],
                                                                             dash="solid" if name == "calibrated"
                                                                             else "dot")))
            meas = []
            for st in pred.get("steps") or []:
                if _num(st.get("load")) is None:
                    continue
                v = ((st.get("quantiles_ms") or {}).get(tier) or {}).get(metric)
                if v is None and st.get("passed") is False:  # the summary's null quantile of a failed step: inf
                    v = math.inf
                meas.append((st["load"], capped(v, thr), st.get("passed")))
            meas = [m for m in meas if m[1] is not None]
            if meas:
                f.add_trace(go.Scatter(x=[m[0] for m in meas], y=[m[1] for m in meas], mode="markers",
                                       name=f"measured: {label}", marker=dict(
                                           color=colors[tier], size=9,
                                           symbol=["circle" if m[2] else "x" for m in meas])))
            f.add_hline(y=thr, line=dict(color=colors[tier], dash="dash", width=1),
                        annotation_text=f"{tier} SLO {thr:g} ms", annotation_position="top left")
    for name, p in (pred.get("predicted") or {}).items():
        if _num(p.get("rated_rps")) is not None:
            f.add_vline(x=p["rated_rps"], line=dict(color="#777", width=1, dash="solid" if name == "calibrated"
                                                    else "dot"),
                        annotation_text=f"{name} {p['rated_rps']:.3g}", annotation_position="bottom right")
    if _num(pred.get("measured_rated_rps")) is not None:
        f.add_vline(x=pred["measured_rated_rps"], line=dict(color="#000", width=2),
                    annotation_text=f"measured {pred['measured_rated_rps']:.3g}", annotation_position="top right")
    # the measured range in view (a theory-only rating several times off lies beyond it: the table gives it);
    # latency up to 2.5x the largest SLO, where the crossings are
    near = [st["load"] for st in pred.get("steps") or [] if _num(st.get("load")) is not None]
    near += [x for x in (_num(pred.get("measured_rated_rps")),
                         _num(((pred.get("predicted") or {}).get("calibrated") or {}).get("rated_rps"))) if x]
    if near:
        f.update_xaxes(range=[0, 1.25 * max(near)])
    if top:
        f.update_yaxes(range=[0, 2.5 * top])
    return f


def breakdown(run: d.RunData, steps: list[dict]) -> go.Figure | None:
    """Mean queue / prefill / network / decode time per step, stacked."""
    rows = [s for s in steps if isinstance(s.get("breakdown"), dict)
            and any(_num(s["breakdown"].get(k)) is not None for k, _, _ in PARTS)]
    if not rows:
        return None
    def x(s: dict) -> float | None:  # a capacity step's offered load, else its load
        return _num(s.get("offered")) if _num(s.get("offered")) is not None else _num(s.get("load"))

    rows.sort(key=lambda s: (x(s) is None, x(s) or 0, s.get("index", 0)))
    labels = [f"#{s.get('index')} @ {x(s):.3g}" if x(s) is not None else f"#{s.get('index')} @ step {s.get('index')}"
              for s in rows]
    xlabel = "offered load (req/s)" if run.is_capacity and d.load_axis(run)[0] != "concurrency" else d.load_axis(run)[1]
    f = figure("Where the time goes, per load step (means)", barmode="stack", xaxis_title=f"step @ {xlabel}",
             yaxis_title="ms", xaxis_type="category")
    sources = {str(s["breakdown"].get("source")) for s in rows}
    for key, name, color in PARTS:
        ys = [_num(s["breakdown"].get(key)) for s in rows]
        if any(y is not None for y in ys):
            f.add_trace(go.Bar(x=labels, y=[y or 0 for y in ys], name=name, marker_color=color,
                               hovertemplate="%{y:.1f} ms<extra>" + name + "</extra>"))
    f.update_layout(meta={"title": "Where the time goes", "source": ", ".join(sorted(sources))})
    return f


def cdf(run: d.RunData, what: str) -> go.Figure | None:
    """TTFT or inter-token latency CDF per tier."""
    ok = run.ok
    if ok.empty:
        return None
    tiers = tier_sort(ok["tier"].unique())
    colors = tier_colors(tiers)
    title = {"ttft": "TTFT distribution per tier", "itl": "Inter-token latency distribution per tier"}[what]
    f = figure(title, xaxis_title=f"{what.upper()} (ms)", yaxis_title="fraction of requests" if what == "ttft"
             else "fraction of token gaps", yaxis_range=[0, 1.01])
    drawn = 0
    for tier in tiers:
        g = ok[ok["tier"] == tier]
        vals = g["ttft_ms"].to_numpy() if what == "ttft" else d.itl_ms(g)
        xs, ys = d.ecdf(vals)
        if xs:
            drawn += 1
            f.add_trace(go.Scatter(x=xs, y=ys, mode="lines", name=f"{tier} (n={len(vals)})",
                                   line=dict(color=colors[tier], shape="hv"),
                                   hovertemplate="%{x:.2f} ms: %{y:.3f}<extra>" + tier + "</extra>"))
    if not drawn:
        return None
    for tier, slo in (run.summary.get("slo") or {}).items():
        thr = _num(slo.get("threshold_ms")) if isinstance(slo, dict) else None
        if what == "ttft" and thr is not None:
            f.add_vline(x=thr, line=dict(color=colors.get(str(tier), "#555"), dash="dash", width=1),
                        annotation_text=f"{tier} SLO", annotation_position="bottom right")
    return f


HEALTH_ROWS = (("ttft", "TTFT (ms)"), ("token_rate", "output tokens/s"), ("kv_usage", "KV usage (%)"),
               ("batch_fill", "batch fill ratio"), ("rejections", "admission rejections/s"))


def health(run: d.RunData) -> tuple[go.Figure | None, list[str]]:
    """The service-health signals over the run, one panel each for those with data; also the names of the
    signals with none (said in the page, not drawn as empty panels)."""
    sig = health_series(run)
    missing = [label for key, label in HEALTH_ROWS if not sig[key]]
    rows = [(key, label) for key, label in HEALTH_ROWS if sig[key]]
    if not rows:
        return None, missing
    f = make_subplots(rows=len(rows), cols=1, shared_xaxes=True, vertical_spacing=0.04 * 5 / max(len(rows), 2),
                      subplot_titles=[label for _, label in rows])
    legends = {}
    for row, (key, label) in enumerate(rows, start=1):
        lg = "legend" if row == 1 else f"legend{row}"
        for i, (name, (xs, ys)) in enumerate(sig[key].items()):
            f.add_trace(go.Scatter(x=xs, y=ys, mode="lines", name=name, legend=lg,
                                   line=dict(color=PALETTE[i % len(PALETTE)], width=1.5),
                                   hovertemplate="t=%{x:.1f}s: %{y:.3g}<extra>%{fullData.name}</extra>"),
                        row=row, col=1)
        domain = f.layout["yaxis" if row == 1 else f"yaxis{row}"].domain
        legends[lg] = dict(x=1.01, xanchor="left", y=domain[1], yanchor="top", font=dict(size=11),
                           bgcolor="rgba(255,255,255,0.6)")
        f.update_yaxes(title_text=label.split(" (")[-1].rstrip(")") if "(" in label else "", row=row, col=1)
    for k, (stage, a, _) in enumerate(step_spans(run)):
        f.add_vline(x=a, line=dict(color="#aaa", width=1, dash="dot"))
        if k < 40:
            f.add_annotation(x=a, y=1.0, yref="paper", text=f"#{stage}", showarrow=False, xanchor="left",
                             font=dict(size=9, color="#888"))
    f.update_xaxes(title_text="seconds since the run start", row=len(rows), col=1)
    f.update_layout(meta={"title": "Service health over the run"}, showlegend=True,
                    **{**LAYOUT, "height": 230 * len(rows) + 40, "margin": dict(l=60, r=200, t=40, b=50),
                       **legends})
    return f, missing


# ------------------------------------------------------------------ comparison


def compare_cdf(runs: Sequence[d.RunData], what: str = "ttft") -> go.Figure | None:
    f = figure(f"{what.upper()} distribution: A vs B (all tiers)", xaxis_title=f"{what.upper()} (ms)",
             yaxis_title="fraction", yaxis_range=[0, 1.01])
    drawn = 0
    for run, label, dash in zip(runs, ("A", "B"), ("dash", "solid"), strict=False):
        ok = run.ok
        vals = (ok["ttft_ms"].to_numpy() if what == "ttft" else d.itl_ms(ok)) if not ok.empty else []
        xs, ys = d.ecdf(vals)
        if xs:
            drawn += 1
            f.add_trace(go.Scatter(x=xs, y=ys, mode="lines", name=f"{label}: {run.run_id}",
                                   line=dict(dash=dash, shape="hv")))
    return f if drawn else None


def compare_load(runs: Sequence[d.RunData], steps: Sequence[list[dict]]) -> go.Figure | None:
    f = figure("p99 TTFT against load: A vs B", yaxis_title="p99 TTFT (ms)",
             xaxis_title=d.load_axis(runs[0])[1])
    drawn = 0
    for k, (run, st, label) in enumerate(zip(runs, steps, ("A", "B"), strict=False)):
        pts = sorted((s for s in st if _num(s.get("load")) is not None), key=lambda s: s["load"])
        if len(pts) < 2:
            continue
        for j, tier in enumerate(tier_sort({t for s in pts for t in (s.get("tiers") or {})})):
            xs = [s["load"] for s in pts if _num(((s["tiers"] or {}).get(tier) or {}).get("p99_ttft_ms")) is not None]
            ys = [s["tiers"][tier]["p99_ttft_ms"] for s in pts
                  if _num(((s["tiers"] or {}).get(tier) or {}).get("p99_ttft_ms")) is not None]
            if xs:
                drawn += 1
                f.add_trace(go.Scatter(x=xs, y=ys, mode="lines+markers", name=f"{label} {tier}",
                                       line=dict(color=PALETTE[j % len(PALETTE)], dash="dash" if k == 0 else "solid")))
        rated, _ = d.rated_load(run)
        if _num(rated) is not None:
            f.add_vline(x=rated, line=dict(dash="dash" if k == 0 else "solid", color="#000", width=1),
                        annotation_text=f"{label} rated {rated:.3g}")
    return f if drawn else None


def compare_breakdown(runs: Sequence[d.RunData], steps: Sequence[list[dict]], rated_index) -> go.Figure | None:
    """Stacked breakdown of A and B side by side, at each run's rated step (or its only step)."""
    xs, parts = [], {k: [] for k, _, _ in PARTS}
    for run, st, label in zip(runs, steps, ("A", "B"), strict=False):
        s = rated_index(run, st)
        if s is None or not isinstance(s.get("breakdown"), dict):
            continue
        xs.append(f"{label}: {run.run_id} (step {s.get('index')})")
        for k in parts:
            parts[k].append(_num(s["breakdown"].get(k)) or 0.0)
    if not xs or not any(any(v) for v in parts.values()):
        return None
    f = figure("Where the time goes: A vs B (means at the rated or only step)", barmode="stack",
             yaxis_title="ms", xaxis_type="category")
    for key, name, color in PARTS:
        f.add_trace(go.Bar(x=xs, y=parts[key], name=name, marker_color=color))
    return f
