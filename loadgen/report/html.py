"""Render ``report.html`` (one run) and the A-vs-B comparison page: one self-contained file each.

Why plotly: a well-kept library (plotly.py and plotly.js, MIT) whose figures stay interactive (hover
for exact values, zoom into one load step, toggle tiers) in a single offline file: the plotly.js bundle
ships inside the Python package and is inlined once per page, no CDN. matplotlib SVGs would be smaller
but static, and a performance engineer reading a TTFT curve wants the numbers under the cursor.

Escaping: jinja2 autoescape for everything in the page's HTML; the figures travel as JSON inside
``<script type="application/json">`` with ``<``, ``>``, ``&`` and the JS line separators written as
``\\uXXXX`` escapes, so no string from the run (an error message, a tier name) can close the script
element or inject markup.
"""

from __future__ import annotations

import datetime as _dt
import math
from pathlib import Path
from typing import Any

import jinja2
from markupsafe import Markup

from loadgen.capacity.headline import interval_span
from loadgen.report import compare as cmp
from loadgen.report import data as d
from loadgen.report import plots as P
from loadgen.report.capacity_page import capacity_sections
from loadgen.report.templates import BASE, COMPARE, MACROS, REPORT

_JSON_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def script_json(text: str) -> str:
    """JSON text made safe to place inside a ``<script>`` element."""
    for ch, esc in _JSON_ESCAPES.items():
        text = text.replace(ch, esc)
    return text


def fmt(v: Any, digits: int = 4) -> str:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return str(v)
    if isinstance(v, int):
        return f"{v:,}" if abs(v) >= 100_000 else str(v)
    if math.isnan(v):
        return "–"
    if math.isinf(v):
        return "∞" if v > 0 else "−∞"
    if abs(v) >= 10 ** digits:
        return f"{v:,.0f}"
    return f"{v:.{digits}g}"


def _env() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.DictLoader({"base": BASE, "macros": MACROS, "report": REPORT, "compare": COMPARE}),
        autoescape=True, undefined=jinja2.ChainableUndefined, trim_blocks=True, lstrip_blocks=True,
    )
    env.globals["fmt"] = fmt
    return env


def _versions() -> dict[str, str]:
    from importlib import metadata

    import plotly

    try:
        mine = metadata.version("slobench")
    except metadata.PackageNotFoundError:
        mine = "dev"
    return {"slobench_version": mine, "plotly_version": plotly.__version__}


def _plotly_js() -> Markup:
    from plotly.offline import get_plotlyjs

    js = get_plotlyjs()
    # the bundle never contains these today; guard anyway, the page must not break if it ever does
    js = js.replace("</script", "<\\/script").replace("<!--", "<\\!--")
    return Markup(js)


class _Plots:
    """Collects the page's figures: ``add()`` gives the template either a plot div id or a skip note."""

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []
        self.by: dict[str, dict[str, Any]] = {}

    def add(self, key: str, title: str, fig, skip: str) -> None:
        if fig is None:
            self.by[key] = {"id": None, "title": title, "skip": skip}
            return
        pid = f"plot-{len(self.items)}"
        # the div as tall as the figure: plotly's responsive resize fills its div, and a div left to its CSS
        # minimum would squeeze the figure (or let it overflow its section) once the window is resized
        height = int(fig.layout.height or P.LAYOUT["height"])
        item = {"id": pid, "title": title, "height": height, "json": Markup(script_json(fig.to_json()))}
        self.items.append(item)
        self.by[key] = item


def _scenario_name(s: dict[str, Any], config: dict[str, Any]) -> str:
    sc = s.get("scenario")
    if isinstance(sc, dict):
        return str(sc.get("name") or sc.get("path") or "")
    if sc:
        return str(sc)
    if config.get("scenario"):
        return str(config["scenario"])
    trace = config.get("trace")
    if isinstance(trace, dict):
        return str(trace.get("path") or trace.get("format") or "trace")
    return ""


def headline(run: d.RunData, first_fail: dict[str, Any] | None = None) -> str | None:
    """The capacity verdict's line, from the numeric fields alone: ``rated_capacity.rate_rps`` (the offered
    rate, the one headline number, as the tile shows it), what was requested there, where the SLO broke, the
    interval and the spec capacity. None without a rated capacity."""
    s = run.summary
    rc = s.get("rated_capacity") if isinstance(s.get("rated_capacity"), dict) else {}
    rate = rc.get("rate_rps")
    if not isinstance(rate, (int, float)):
        return None
    closed = rc.get("axis") == "concurrency" or s.get("axis") == "concurrency"
    text = f"Rated capacity {'≥ ' if rc.get('lower_bound') else ''}{fmt(rate)} req/s " + (
        f"served at {fmt(rc.get('load'))} users" if closed else "offered")
    if not closed and isinstance(rc.get("requested_rps"), (int, float)):
        text += f" (requested {fmt(rc['requested_rps'])} req/s)"
    if rc.get("lower_bound"):
        text += ": every SLO held at every load tried, so the capacity is at least that"
    elif first_fail and isinstance(first_fail.get("offered"), (int, float)):
        text += f": every SLO held there and broke at {fmt(first_fail['offered'])} " + (
            "users" if closed else f"req/s offered (requested {fmt(first_fail.get('requested'))} req/s)")
    if isinstance(rc.get("ci_low"), (int, float)) and isinstance(rc.get("ci_high"), (int, float)):
        binding = rc.get("binding") if isinstance(rc.get("binding"), dict) else {}
        conf = f"{fmt(100 * rc['confidence'])}% " if isinstance(rc.get("confidence"), (int, float)) else ""
        text += (f". {conf}interval of the capacity: {interval_span(rc, fmt)} "
                 f"{'users' if rc.get('ci_of') == 'concurrency' else 'req/s'} (estimate {fmt(rc.get('estimate'))}; "
                 f"{rc.get('boundary') or '-'} boundary; binding: {binding.get('tier', '-')} "
                 f"{binding.get('metric', '')})")
    cause = rc.get("cause") if isinstance(rc.get("cause"), dict) else None
    if cause and cause.get("cause"):
        text += f". Cause of the break: {cause['cause']} ({cause.get('why', '')})"
    if isinstance(rc.get("spec_rate_rps"), (int, float)):
        head = s.get("headroom")
        text += (f". Spec capacity with {fmt(100 * head) if isinstance(head, (int, float)) else '?'}% headroom: "
                 f"{fmt(rc['spec_rate_rps'])} req/s")
    return text + "."


def _verdicts(run: d.RunData, first_fail: dict[str, Any] | None = None) -> list[dict[str, str]]:
    s, out = run.summary, []
    n = s.get("requests")
    if run.is_capacity:
        v = s.get("verdict")
        rc = s.get("rated_capacity") if isinstance(s.get("rated_capacity"), dict) else {}
        cls = {"rated": "good", "never_met": "bad", "never_broke": "warn"}.get(str(v), "warn")
        text = headline(run, first_fail)
        if text is None:  # no rating: the search's own account (never met, or no verdict yet)
            text = s.get("verdict_text") or f"verdict: {v or 'unknown (no verdict in summary.json)'}"
        elif v not in ("rated", "never_broke"):
            text = f"{str(v).upper()}: the steps say: {text}"
        out.append({"cls": cls, "text": str(text)})
        if rc and rc.get("concurrency_agree") is False:
            out.append({"cls": "warn", "text": (
                f"Little's law concurrency ({fmt(rc.get('concurrency_littles_law'))}) and the measured in-flight "
                f"count ({fmt(rc.get('concurrency_measured'))}) disagree: the rated point is not a steady state.")})
    elif run.requests.empty and not n:
        out.append({"cls": "warn", "text": "No requests recorded: the run is empty."})
    else:
        total = len(run.requests) if not run.requests.empty else n
        ok = len(run.ok) if not run.requests.empty else s.get("completed")
        if not ok:
            out.append({"cls": "bad", "text": f"No request succeeded ({total} sent)."})
        else:
            out.append({"cls": "good" if ok == total else "warn",
                        "text": f"{ok} of {total} requests succeeded."})
    if s.get("stopped_early"):
        out.append({"cls": "warn", "text": f"The run ended early: {s['stopped_early']}"})
    fit = s.get("request_fit") if isinstance(s.get("request_fit"), dict) else {}
    for note in fit.get("notes") or []:  # what the target did not accept, and what that means for the numbers
        out.append({"cls": "warn", "text": f"Target: {note}"})
    pl = s.get("prompt_length") if isinstance(s.get("prompt_length"), dict) else {}
    if pl.get("flagged") and pl.get("note"):
        out.append({"cls": "warn", "text": f"Prompt lengths: {pl['note']}"})
    pc = s.get("prefix_cache") if isinstance(s.get("prefix_cache"), dict) else {}
    if pc.get("warm_cache") and pc.get("note"):
        out.append({"cls": "warn", "text": f"Prefix cache: {pc['note']}"})
    if s.get("valid") is False:
        out.append({"cls": "bad", "text": "INVALID RUN: " + str(s.get("invalid_reason") or
                                                               "the load generator could not keep its schedule")})
    elif s.get("valid") is None:
        out.append({"cls": "warn", "text": "summary.json says nothing about the run's validity."})
    return out


def _cards(run: d.RunData) -> list[dict[str, Any]]:
    s = run.summary
    if run.is_capacity:
        rc = s.get("rated_capacity") if isinstance(s.get("rated_capacity"), dict) else {}
        head = s.get("headroom")
        return [
            {"label": "rated capacity (offered)", "value": rc.get("rate_rps"), "unit": "req/s"},
            {"label": "judged over windows of", "value": rc.get("window_s"), "unit": "s"},
            {"label": f"spec capacity ({fmt(100 * head) if isinstance(head, (int, float)) else '?'}% headroom)",
             "value": rc.get("spec_rate_rps"), "unit": "req/s"},
            {"label": "concurrency at rated", "value": rc.get("concurrency"), "unit": ""},
            {"label": "output at rated", "value": rc.get("output_tok_s"), "unit": "tok/s"},
            {"label": "load steps", "value": len(s.get("steps") or []), "unit": ""},
            {"label": "search duration", "value": s.get("duration_s"), "unit": "s"},
        ]
    lat = s.get("client_lateness") or s.get("lateness") or {}
    return [
        {"label": "requests", "value": s.get("requests", len(run.requests)), "unit": ""},
        {"label": "failed", "value": s.get("failed"), "unit": ""},
        {"label": "request throughput", "value": s.get("request_throughput"), "unit": "req/s"},
        {"label": "output throughput", "value": s.get("output_throughput"), "unit": "tok/s"},
        {"label": "TTFT p50", "value": s.get("median_ttft_ms"), "unit": "ms"},
        {"label": "TTFT p99", "value": s.get("p99_ttft_ms"), "unit": "ms"},
        {"label": "ITL p99", "value": s.get("p99_itl_ms"), "unit": "ms"},
        {"label": "client lateness p99", "value": lat.get("p99_ms") if isinstance(lat, dict) else None,
         "unit": "ms"},
    ]


def _meta(run: d.RunData) -> dict[str, Any]:
    s = run.summary
    keys = ("kind", "run_id", "scenario", "target", "driver", "model", "started_at", "duration_s", "duration",
            "git_commit", "versions", "machine", "client_lateness", "lateness", "valid", "invalid_reason",
            "verdict", "verdict_text", "axis", "slo", "headroom", "goodput_slo", "stopped_early", "requests_planned",
            "target_probe", "request_fit", "prompt_length", "scrape", "prefix_cache")
    meta: dict[str, Any] = {"kind": run.kind, "run_id": run.run_id, "folder": str(run.path)}
    for k in keys:
        if k in s and k not in ("kind", "run_id"):
            meta[k] = s[k]
    if run.config:
        meta["config.json"] = run.config
    return meta


def _duration(run: d.RunData) -> float | None:
    s = run.summary
    for k in ("duration_s", "duration"):
        if isinstance(s.get(k), (int, float)):
            return float(s[k])
    return None


def render_report(run: d.RunData) -> str:
    steps = d.steps(run)
    pl = _Plots()
    cap: dict[str, Any] = {}
    if run.is_capacity:
        cap = capacity_sections(run, steps, pl)
    else:
        pl.add("load", "TTFT against load", P.load_vs_ttft(run, steps), "a single load level: no load axis to plot")
    pl.add("breakdown", "Latency breakdown", P.breakdown(run, steps),
           "no breakdown: the target sent no per-request timing and the scrape has no vLLM phase histograms")
    if not run.is_capacity:  # one load: the whole run's distributions (a capacity run's are per load, above)
        none_ok = "no successful request, so no latency to plot"
        pl.add("ttft_cdf", "TTFT CDF", P.cdf(run, "ttft"), none_ok)
        pl.add("itl_cdf", "ITL CDF", P.cdf(run, "itl"), none_ok if run.ok.empty else
               "no request streamed more than one chunk")
    if run.is_capacity:
        pl.add("prediction", "Predicted against measured", P.prediction(run),
               "no prediction.json: `slobench plan SCENARIO --calibrate ... --capacity-run THIS_FOLDER` puts one here")
    hfig, missing = P.health(run)
    pl.add("health", "Service health", hfig, "no records and no scraped metrics")
    step_tiers = P.tier_sort({t for s in steps for t in (s.get("tiers") or {})})
    ctx = {
        **_versions(), "generated_at": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "plotly_js": _plotly_js(), "plots": pl.items, "plots_by": pl.by,
        "run": run, "s": run.summary, "scenario_name": _scenario_name(run.summary, run.config),
        "duration": _duration(run), "verdicts": _verdicts(run, cap.get("first_fail")), "cards": _cards(run),
        "rebuilt": run.summary_rebuilt,
        "breakdown_source": ", ".join(sorted({str((st.get("breakdown") or {}).get("source")) for st in steps
                                              if (st.get("breakdown") or {}).get("source")})),
        "steps": steps, "step_tiers": step_tiers, "axis": d.load_axis(run)[0],
        "tiers": d.tier_table(run), "errors": d.errors_table(run), "meta": _meta(run),
        "prediction": run.prediction, "cap": cap,
        "health_missing": [] if hfig is None and not missing else missing, "has_metrics": not run.metrics.empty,
    }
    return _env().get_template("report").render(**ctx)


def render_compare(a: d.RunData, b: d.RunData) -> str:
    sa, sb = d.steps(a), d.steps(b)
    pl = _Plots()
    pl.add("load", "p99 TTFT against load", P.compare_load([a, b], [sa, sb]),
           "neither run has several load steps")
    pl.add("ttft_cdf", "TTFT CDF", P.compare_cdf([a, b], "ttft"), "no successful request in either run")
    pl.add("itl_cdf", "ITL CDF", P.compare_cdf([a, b], "itl"), "no streamed token gaps in either run")
    pl.add("breakdown", "Breakdown", P.compare_breakdown([a, b], [sa, sb], cmp.reference_step),
           "neither run has a latency breakdown")
    ctx = {
        **_versions(), "generated_at": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "plotly_js": _plotly_js(), "plots": pl.items, "plots_by": pl.by, "a": a, "b": b,
        "rows": cmp.headline_rows(a, b), "tier_rows": cmp.tier_rows(a, b), "meta_a": _meta(a), "meta_b": _meta(b),
    }
    return _env().get_template("compare").render(**ctx)


def write_report(run_dir: str | Path, out: str | Path | None = None, export: bool = True) -> Path:
    """Render ``report.html`` for a run folder (and export its records next to requests.jsonl)."""
    run = d.load_run(run_dir)
    path = Path(out) if out else run.path / "report.html"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_report(run), encoding="utf-8")
    if export and (run.path / "requests.jsonl").is_file():
        from loadgen.results.export import export_records

        export_records(run.path)
    return path


def write_compare(run_a: str | Path, run_b: str | Path, out: str | Path | None = None) -> Path:
    a, b = d.load_run(run_a), d.load_run(run_b)
    path = Path(out) if out else b.path / f"compare-{a.path.name}.html"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_compare(a, b), encoding="utf-8")
    return path
