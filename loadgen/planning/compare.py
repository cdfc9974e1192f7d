"""A prediction beside a measured ``slobench capacity`` run: the run folder's steps (each at the rate it
offered, with each tier's judged SLO quantiles), the predicted quantiles at those loads, and the rated
capacity's error, theory-only and calibrated. ``write_prediction`` leaves it in the run folder
(``prediction.json``), where the run's HTML report finds it and draws the predicted curve beside the steps."""

from __future__ import annotations

import json
from pathlib import Path

from loadgen.planning.predict import Predictor
from loadgen.planning.requests import PlanError
from loadgen.results.rundir import PREDICTION, SUMMARY, write_json


def read_capacity_run(run_dir: str | Path) -> dict:
    """The run's ``summary.json``; a PlanError unless it is a capacity run with steps."""
    path = Path(run_dir) / SUMMARY
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PlanError(f"{run_dir}: no {SUMMARY} (is this a capacity run folder?)") from None
    except ValueError as e:
        raise PlanError(f"{path}: not JSON ({e})") from None
    if not isinstance(summary.get("steps"), list) or not summary["steps"]:
        raise PlanError(f"{path}: not a capacity run (no steps)")
    return summary


def measured_steps(summary: dict) -> list[dict]:
    """Each counted step: its offered load (requested when not recorded), verdict, judged quantiles (ms)."""
    out = []
    for s in summary["steps"]:
        if not isinstance(s, dict) or s.get("counted") is False or s.get("load") is None:
            continue
        q = {tier: {m: j.get("value_ms_q") for m, j in (t.get("judged") or {}).items()}
             for tier, t in (s.get("tiers") or {}).items() if isinstance(t, dict)}
        load = s.get("offered_rps") if isinstance(s.get("offered_rps"), (int, float)) else s["load"]
        out.append({"load": float(load), "requested": float(s["load"]), "passed": s.get("passed"),
                    "phase": s.get("phase"), "quantiles_ms": q})
    return sorted(out, key=lambda s: s["load"])


def measured_rated(summary: dict) -> float | None:
    rc = summary.get("rated_capacity")
    return float(rc["rate_rps"]) if isinstance(rc, dict) and isinstance(rc.get("rate_rps"), (int, float)) else None


def error(predicted: float | None, measured: float | None) -> float | None:
    """predicted / measured - 1 (None when either is missing or the measurement is 0)."""
    if predicted is None or not measured:
        return None
    return predicted / measured - 1


def compare(summary: dict, predictors: dict[str, Predictor], rated: dict[str, float | None]) -> dict:
    """Per predictor (``theory``, ``calibrated``): its quantiles at each measured step's load, and the
    rated capacity's error against the run's ``rated_capacity.rate_rps``."""
    steps = measured_steps(summary)
    meas = measured_rated(summary)
    out: dict = {"measured_rated_rps": meas, "verdict": summary.get("verdict"), "steps": steps, "predicted": {}}
    for name, pred in predictors.items():
        at_steps = [pred.point(s["load"]) for s in steps]
        ratios = []
        for s, p in zip(steps, at_steps, strict=True):
            for tier, qs in s["quantiles_ms"].items():
                for m, v in qs.items():
                    pv = p["quantiles_ms"].get(tier, {}).get(m)
                    if isinstance(v, (int, float)) and isinstance(pv, (int, float)) and v > 0 and pv < float("inf"):
                        ratios.append(pv / v)
        out["predicted"][name] = {"rated_rps": rated.get(name), "error": error(rated.get(name), meas),
                                  "at_steps": at_steps,
                                  "median_quantile_ratio": sorted(ratios)[len(ratios) // 2] if ratios else None}
    return out


def write_prediction(run_dir: str | Path, plan: dict, slos: dict) -> Path:
    """``prediction.json`` in the capacity run's folder: per predictor its rated capacity, error and curve
    (the plan's points and those at the measured steps' loads, by load); the SLOs, the measured steps
    (``measured_steps``) and rating."""
    cmp_ = plan["comparison"]
    doc: dict = {"scenario": plan["scenario"], "model": plan["model"].get("name"), "tp": plan["tp"],
                 "hardware": (plan.get("hardware") or {}).get("name"), "measured_rated_rps": cmp_["measured_rated_rps"],
                 "slos": {t: [{"metric": s.metric, "threshold_ms": s.threshold_ms, "quantile": s.quantile} for s in ss]
                          for t, ss in slos.items()}, "steps": cmp_["steps"], "predicted": {}}
    for name, m in plan["models"].items():
        p = cmp_["predicted"][name]
        pts = sorted([*m.get("curve", []), *p["at_steps"]], key=lambda q: q["load"])
        doc["predicted"][name] = {"rated_rps": m["rated_rps"], "error": p["error"],
                                  "median_quantile_ratio": p["median_quantile_ratio"], "curve": pts}
    path = Path(run_dir) / PREDICTION
    write_json(path, doc)
    return path
