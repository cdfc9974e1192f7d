"""One plan: the closed-form theory and the simulated prediction for each step-time model (``theory``: the
roofline of the model on the hardware; ``calibrated``: the probe's fit), per replica and per GPU, and the
replicas a target load needs."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from loadgen.planning import theory
from loadgen.planning.hardware import Accelerator
from loadgen.planning.model_shape import ModelShape
from loadgen.planning.predict import Predictor
from loadgen.planning.requests import PlanError, Requests, draw
from loadgen.planning.simulate import EngineShape
from loadgen.planning.step_model import StepModel, decode_step_s, prefill_s
from loadgen.scenario.model import Scenario

CURVE_POINTS = 10


@dataclass
class PlanInputs:
    scenario: Scenario
    shape: ModelShape
    engine: EngineShape
    hardware: Accelerator | None  # None: only a calibrated model (the KV pool is the engine's)
    tp: int = 1
    target_rps: float | None = None
    headroom: float = 0.2
    requests: int = 6000  # simulated per draw
    draws: int = 2
    seed: int = 0

    def requests_drawn(self) -> list[Requests]:
        return [draw(self.scenario, self.seed * 7919 + k + 1, self.requests) for k in range(self.draws)]


def slos_of(scn: Scenario) -> dict:
    return {t: ss for t, ss in scn.slos().items() if ss}


def closed_form(inp: PlanInputs, model: StepModel, reqs: Requests) -> dict:
    """Memory, KV, batch, step times, the design claims' throughput and the Erlang-C SLO load, per replica."""
    eng, shape, scn = inp.engine, inp.shape, inp.scenario
    kv = theory.request_kv(reqs, eng.block_size, eng.enable_prefix_caching)
    pool = eng.kv_tokens
    if kv.max_peak_tokens > pool:
        raise PlanError(f"the longest request needs {kv.max_peak_tokens} KV tokens, more than the pool of {pool} "
                        f"(raise --tp, or the engine's KV)")
    by_mean = theory.max_batch(pool, kv.mean_tokens, kv.shared_tokens, None)
    by_peak = theory.max_batch(pool, kv.peak_tokens, kv.shared_tokens, None)
    batch = max(1, min(by_mean, eng.max_num_seqs))
    tpot = [s.threshold_ms for ss in slos_of(scn).values() for s in ss if s.metric == "tpot_ms"]
    if tpot:
        batch = max(1, min(batch, theory.tpot_batch(model, kv, min(tpot), batch)))
    tp = theory.throughput(model, batch, kv, eng.chunk)
    ttft = [(s.threshold_ms, s.quantile) for ss in slos_of(scn).values() for s in ss if s.metric in ("ttft_ms",
                                                                                                    "ttfot_ms")]
    pre = prefill_s(model, int(round(kv.mean_uncached_in)), eng.chunk or int(round(kv.mean_uncached_in)) or 1)
    slo_rps = min((theory.slo_load(tp, ms, q, pre) for ms, q in ttft), default=tp.requests_s)
    return {"weights_bytes": shape.weights_bytes, "params": shape.params,
            "kv_bytes_per_token": shape.kv_bytes_per_token, "kv_pool_tokens": pool, "request_kv": kv.as_dict(),
            "max_batch_by_memory": by_mean,
            "max_batch_by_memory_peak": by_peak, "batch": batch,
            "decode_step_ms_batch_1": decode_step_s(model, 1, kv.mean_in + kv.mean_out / 2) * 1e3,
            "decode_step_ms": tp.step_s * 1e3, "prefill_ms_mean_prompt": pre * 1e3,
            "throughput": tp.as_dict(), "slo_rps": slo_rps,
            "slo_output_tokens_s": slo_rps * kv.mean_out,
            "concurrency_at_slo": slo_rps * tp.slot_time_s}  # Little's law


def predicted(inp: PlanInputs, model: StepModel, draws: list[Requests], start: float) -> dict:
    """The simulation's rated capacity and its curve around it."""
    pred = Predictor(draws, inp.engine, model, slos_of(inp.scenario))
    rated = pred.rated_capacity(max(start, 1e-3))
    top = rated if rated else start
    curve = pred.curve(np.linspace(top * 0.2, top * 1.3, CURVE_POINTS)) if top else []
    return {"rated_rps": rated, "curve": curve, "predictor": pred}


def per_gpu(rps: float | None, inp: PlanInputs, mean_out: float) -> dict:
    if rps is None:
        return {"req_s": None, "output_tokens_s": None}
    return {"req_s": rps / inp.tp, "output_tokens_s": rps * mean_out / inp.tp}


def make_plan(inp: PlanInputs, models: dict[str, StepModel]) -> dict:
    """The plan for each step model: closed form, simulation, per GPU, replicas for the target."""
    draws = inp.requests_drawn()
    out: dict = {"scenario": inp.scenario.name, "model": inp.shape.as_dict(), "tp": inp.tp,
                 "hardware": inp.hardware.as_dict() if inp.hardware else None, "engine": vars(inp.engine),
                 "target_rps": inp.target_rps, "headroom": inp.headroom, "simulation":
                 {"requests_per_draw": inp.requests, "draws": inp.draws, "seed": inp.seed}, "models": {}}
    for name, model in models.items():
        cf = closed_form(inp, model, draws[0])
        sim = predicted(inp, model, draws, cf["slo_rps"] or cf["throughput"]["requests_s"])
        rated = sim["rated_rps"]
        mean_out = cf["request_kv"]["mean_out"]
        entry = {"step_model": model.as_dict(), "closed_form": cf, "rated_rps": rated,
                 "spec_rps": rated * (1 - inp.headroom) if rated is not None else None,
                 "per_gpu": per_gpu(rated, inp, mean_out), "curve": sim["curve"], "predictor": sim["predictor"]}
        if inp.target_rps:
            n = theory.replicas(inp.target_rps, rated or 0.0, inp.headroom)
            entry["replicas"] = n
            entry["gpus"] = n * inp.tp if n is not None else None
        out["models"][name] = entry
    return out
