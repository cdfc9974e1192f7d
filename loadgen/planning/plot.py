"""The plan's plot: predicted SLO quantiles against load per tier (theory-only and calibrated), the SLO
thresholds, the predicted rated capacities and, with a capacity run, its measured steps and rating."""

from __future__ import annotations

from pathlib import Path

DASH = {"theory": "dot", "probe": "dashdot", "calibrated": "solid"}


def write_plot(path: str | Path, curves: dict[str, list[dict]], slos: dict, rated: dict[str, float | None],
               comparison: dict | None = None, title: str = "slobench plan") -> None:
    """``curves``: predictor -> points (``Predictor.point``); ``slos``: tier -> its SLOs."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for name, pts in curves.items():
        for tier, ss in slos.items():
            for s in ss:
                ys = [min(p["quantiles_ms"][tier][s.metric], 10 * s.threshold_ms) for p in pts]
                fig.add_trace(go.Scatter(x=[p["load"] for p in pts], y=ys, mode="lines",
                                         line={"dash": DASH.get(name, "dash")},
                                         name=f"{name}: {tier} p{s.quantile * 100:g} {s.metric}"))
    for tier, ss in slos.items():
        for s in ss:
            fig.add_hline(y=s.threshold_ms, line={"dash": "dash", "width": 1},
                          annotation_text=f"{tier} SLO {s.threshold_ms:g} ms")
    for name, r in rated.items():
        if r:
            fig.add_vline(x=r, line={"dash": DASH.get(name, "dash"), "width": 1},
                          annotation_text=f"{name} rated {r:.3g} req/s")
    if comparison:
        steps = comparison["steps"]
        for tier, ss in slos.items():
            for s in ss:
                fig.add_trace(go.Scatter(
                    x=[st["load"] for st in steps], mode="markers", name=f"measured: {tier} {s.metric}",
                    y=[min(st["quantiles_ms"].get(tier, {}).get(s.metric) or 0, 10 * s.threshold_ms) for st in steps],
                    marker={"symbol": ["circle" if st["passed"] else "x" for st in steps], "size": 9}))
        if comparison.get("measured_rated_rps"):
            fig.add_vline(x=comparison["measured_rated_rps"], line={"width": 2},
                          annotation_text=f"measured rated {comparison['measured_rated_rps']:.3g} req/s")
    fig.update_layout(title=title, xaxis_title="load (requests/s)", yaxis_title="latency (ms; capped at 10x SLO)",
                      template="plotly_white")
    fig.write_html(str(path), include_plotlyjs=True, full_html=True)
