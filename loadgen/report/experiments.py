"""``experiments.html``: the claims table (claim -> setting -> measured -> holds here?) and one plotly plot
per experiment, from ``experiments.json`` alone, self-contained."""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

STYLE = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px}table{border-collapse:collapse;width:100%}
td,th{border:1px solid #ccc;padding:4px 8px;vertical-align:top;text-align:left}th{background:#f3f3f3}
.yes{color:#1a7f37;font-weight:bold}.no{color:#cf222e;font-weight:bold}.note{color:#555;font-size:90%}
code{font-size:90%}"""


def _figure(exp: dict[str, Any], include_js: bool) -> str:
    import plotly.graph_objects as go

    plot = exp["plot"]
    fig = go.Figure()
    for name, s in plot["series"].items():
        if plot["kind"] == "line":
            fig.add_trace(go.Scatter(x=s["x"], y=s["y"], name=name, mode="lines+markers"))
        else:
            fig.add_trace(go.Bar(x=[str(x) for x in s["x"]], y=s["y"], name=name))
    fig.update_layout(title=plot["title"], xaxis_title=plot["x_title"], yaxis_title=plot["y_title"], height=380,
                      template="plotly_white", barmode="group")
    return fig.to_html(full_html=False, include_plotlyjs=include_js)


def _rows(exp: dict[str, Any]) -> str:
    out = []
    for f in exp["findings"]:
        verdict = '<span class="yes">yes</span>' if f["holds"] else '<span class="no">no</span>'
        note = f'<div class="note">{html.escape(f["note"])}</div>' if f["note"] else ""
        out.append(f"<tr><td><b>{html.escape(exp['name'])}</b><br>{html.escape(f['claim'])} "
                   f"(claimed: {html.escape(f['seed_figure'])})</td><td>{html.escape(f['setting'])}</td>"
                   f"<td>{html.escape(f['measured'])}</td><td>{verdict}{note}"
                   f"<div class=\"note\">rule: {html.escape(f['rule'])}</div></td></tr>")
    return "".join(out)


def render(doc: dict[str, Any]) -> str:
    exps = doc["experiments"]
    head = (f"<p>{len(exps)} of {len(doc['requested'])} experiments, {html.escape(doc['form'])} form, started "
            f"{html.escape(doc['started'])}{' — interrupted' if doc.get('interrupted') else ''}. Each runs on the "
            "reference engine in-process (CPU); figures are this machine's.</p>")
    table = ("<table><tr><th>claim</th><th>setting</th><th>measured</th><th>holds here?</th></tr>"
             + "".join(_rows(e) for e in exps) + "</table>")
    sections = []
    for i, e in enumerate(exps):
        params = html.escape(json.dumps(e["params"], default=str))
        sections.append(f"<h2>{html.escape(e['title'])} <code>{html.escape(e['name'])}</code></h2>"
                        f"<p class=\"note\">parameters: <code>{params}</code>; {e['wall_s']:.1f} s</p>"
                        + _figure(e, include_js=i == 0))
    return (f"<!doctype html><html><head><meta charset=\"utf-8\"><title>slobench experiments</title>"
            f"<style>{STYLE}</style></head><body><h1>slobench experiments</h1>{head}{table}{''.join(sections)}"
            "</body></html>")


def write_experiments_html(doc: dict[str, Any], path: str | Path) -> Path:
    path = Path(path)
    path.write_text(render(doc), encoding="utf-8")
    return path
