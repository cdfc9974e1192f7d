"""``slobench plan SCENARIO``: capacity planning before (and beside) a measured capacity run.

From a model's sizes (a preset of the engine, a checkpoint's ``config.json``, or explicit sizes) and a
hardware profile (``--hardware``: a spec-sheet accelerator, or ``host``: measured here) the theory gives
memory, KV, batch, engine step times and throughput. ``--calibrate URL`` (or ``embedded``: the scenario's
own engine, started here) fits the engine's step time to a running target instead: the probe times its
steps at fixed batches and prompt lengths (``--probe-*``, ``planning/step_timing.py``), then load points
(the scenario's own requests at shares of the predicted capacity, ``--load-point``) whose measured service
times scale the fit (``planning/load_point.py``). For each step-time model a discrete-event simulation of
the scenario on the engine's scheduler predicts the rated capacity; ``--target-rps`` turns it into
replicas and GPUs; ``--capacity-run DIR`` sets the prediction beside a measured capacity run (and leaves it
in the run folder, ``prediction.json``, whose ``report.html`` then draws it beside the load steps). The
engine is imported here only (loadgen reaches it from its commands): its presets, its config reader and
``EngineConfig``'s defaults, plain data that imports without torch, so the client plans alone;
``--hardware host`` and ``--calibrate embedded`` need the engine extra.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from loadgen.commands.common import EXIT_FAIL, EXIT_OK, UsageError, engine_opt

DEFAULT_TIMED_BATCHES = "1,8,32"
MAX_TIMED_PROMPT = 4096  # the longest prompt the probe sends (its engine steps are timed one by one)


def _ints(text: str) -> tuple[int, ...]:
    try:
        out = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, found {text!r}") from None
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"expected integers >= 1, found {text!r}")
    return out


def register(sub) -> argparse.ArgumentParser:
    """Add ``plan`` to the subcommands."""
    p = sub.add_parser("plan", help="capacity planning: theory, a probe that fits the engine's step time, a "
                                    "simulated rated capacity, replicas for a target load, the comparison with a "
                                    "capacity run",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("scenario", help="a synthetic, single-turn, open-loop scenario: a YAML file or a built-in's "
                                     "name, e.g. chat (slobench scenarios lists them)")
    p.add_argument("--model", help="an engine preset (tiny, small), a Hugging Face folder with config.json, or "
                                   "sizes layers=32,hidden=4096,heads=32,kv_heads=8,intermediate=14336,vocab=128256 "
                                   "(default: the scenario's engine.model, else tiny)")
    p.add_argument("--dtype", help="weights and KV dtype: bf16, fp16, float32, fp8 (default: float32 on "
                                   "--hardware host, the engine's CPU default; else bf16)")
    p.add_argument("--hardware", help="H100, H200, B200, A100-80GB, L40S, L4, MI300X (spec sheets), or host (this "
                                      "machine's CPU, measured); needed unless --calibrate is given")
    p.add_argument("--calibrate", dest="timing_target", metavar="TARGET_URL",
                   help="fit the engine's step time to a running target (about a minute), or 'embedded': start the "
                        "scenario's reference engine for it (not `slobench calibrate`, which checks the capacity "
                        "search)")
    p.add_argument("--tp", type=int, help="tensor-parallel degree (default: the smallest of 1, 2, 4, 8 whose "
                                          "memory holds the weights and the longest request's KV)")
    p.add_argument("--mem-util", type=float, default=0.9,
                   help="share of device memory for weights and KV (default 0.9)")
    p.add_argument("--overhead-ms", type=float, default=0.0,
                   help="fixed time per step the roofline does not see (default 0: the theory is a lower bound)")
    p.add_argument("--target-rps", type=float, help="a load to plan for: replicas and GPUs to carry it")
    p.add_argument("--headroom", type=float, help="share of capacity held back (default: the scenario's)")
    p.add_argument("--capacity-run", type=Path, metavar="RUN_DIR",
                   help="a slobench capacity run folder to compare the prediction with; writes "
                        "RUN_DIR/prediction.json and redraws RUN_DIR/report.html with the predicted curve")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a scenario value")
    p.add_argument("--engine-opt", action="append", type=engine_opt, metavar="KEY=VALUE",
                   help="an engine option over the scenario's engine section (repeatable)")
    p.add_argument("--requests", type=int, default=6000, help="simulated requests per draw (default 6000)")
    p.add_argument("--draws", type=int, default=2, help="simulated arrival draws (default 2)")
    p.add_argument("--seed", type=int, help="the simulation's seed (default: the scenario's)")
    p.add_argument("--probe-batches", type=_ints, default=_ints(DEFAULT_TIMED_BATCHES),
                   help="probe batch sizes (1,8,32)")
    p.add_argument("--probe-contexts", type=_ints, default=_ints("64,384"), help="probe decode prompt lengths")
    p.add_argument("--probe-prefill", type=_ints, help="probe prefill prompt lengths (default 32,128,256 and the "
                   "scenario's longest prompt, up to 4096, when it is longer than the engine's prefill chunk)")
    p.add_argument("--probe-output", type=int, default=32, help="probe tokens per decode request (32)")
    p.add_argument("--probe-rounds", type=int, default=5, help="requests per probe user (5)")
    p.add_argument("--load-point", default="0.6,0.85", metavar="FRACS",
                   help="after the probe, send the scenario's own requests at each share in turn of the capacity "
                        "the model so far predicts, and scale the fit until the simulation's service times match "
                        "the target's (default 0.6,0.85; 0: the probe's fit alone)")
    p.add_argument("--load-point-s", type=float, default=20.0, metavar="S", help="each load point's length (20 s)")
    p.add_argument("--json", type=Path, metavar="FILE", help="write the plan as JSON")
    p.add_argument("--plot", type=Path, metavar="FILE", help="write a plotly HTML plot of the predicted curves")
    p.set_defaults(cmd="plan")
    return p


def resolve_model(spec: str, dtype_bytes: int):
    """A ModelShape from an engine preset, a checkpoint folder's config.json, or explicit sizes."""
    from engine.model.model_config import PRESETS, ModelConfig  # plain data: no torch
    from loadgen.planning.model_shape import from_config, from_sizes

    if spec in PRESETS:
        return from_config(PRESETS[spec], dtype_bytes, name=spec)
    folder = Path(spec).expanduser()
    if folder.is_dir():
        path = folder / "config.json"
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
            return from_config(ModelConfig.from_hf_config(raw.get("text_config", raw)), dtype_bytes, name=folder.name)
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise UsageError(f"--model {spec}: cannot read {path}: {e}") from None
    if "=" in spec:
        try:
            return from_sizes(spec, dtype_bytes)
        except ValueError as e:
            raise UsageError(f"--model: {e}") from None
    raise UsageError(f"--model {spec!r}: not a preset ({', '.join(PRESETS)}), a folder or KEY=VALUE sizes")


def engine_shape(opts: dict[str, Any], kv_tokens: int | None):
    """The scheduler's knobs: the scenario's engine options over ``EngineConfig``'s defaults."""
    from engine.request.config import EngineConfig  # plain data: no torch
    from loadgen.planning.simulate import EngineShape

    names = {f.name for f in dataclasses.fields(EngineConfig)}
    kwargs = {k: v for k, v in opts.items() if k in names}
    for name in ("max_waiting_per_tier", "tier_ttft_slo_ms"):  # as the server does: unnamed tiers keep defaults
        if isinstance(kwargs.get(name), dict):
            kwargs[name] = {**getattr(EngineConfig(), name), **kwargs[name]}
    try:
        cfg = EngineConfig(**kwargs)
    except (TypeError, ValueError) as e:
        raise UsageError(f"engine options: {e}") from None
    pool = cfg.num_kv_blocks * cfg.block_size if cfg.num_kv_blocks else cfg.kv_cache_tokens
    fields = {f.name for f in dataclasses.fields(EngineShape)} - {"kv_tokens"}
    return EngineShape(**{k: getattr(cfg, k) for k in fields}, kv_tokens=kv_tokens or pool)


def step_timing_settings(args: argparse.Namespace, chunk: int | None = None, longest: int = 0):
    """The probe's points to time; ``chunk`` the engine's prefill chunk, ``longest`` the scenario's longest
    prompt (timed too, chunk by chunk, when longer than a chunk: a long prompt's later chunks attend to more)."""
    from loadgen.planning.step_timing import StepTimingSettings

    prefill = args.probe_prefill
    if prefill is None:
        longest_timed = (min(longest, MAX_TIMED_PROMPT),) if chunk and longest > chunk else ()
        prefill = StepTimingSettings().prefill_lengths + longest_timed
    try:
        return StepTimingSettings(batches=args.probe_batches, contexts=args.probe_contexts,
                                  output_tokens=args.probe_output, prefill_lengths=tuple(prefill),
                                  rounds=args.probe_rounds, chunk=chunk)
    except ValueError as e:
        raise UsageError(str(e)) from None


def fit_to_target(args: argparse.Namespace, engine_opts: dict[str, Any], scn, eng):
    """The step-time fit to ``--calibrate``'s target (a URL, or the scenario's engine started here): the probe's
    timed points, then the load points."""
    from loadgen.planning.load_point import LoadPointPlan
    from loadgen.target.embedded import EmbeddedEngine

    settings = step_timing_settings(args, eng.chunk, scn.synthetic.input_len.longest)
    try:
        fracs = tuple(float(x) for x in str(args.load_point).split(",") if x.strip())
        point = None if fracs in ((), (0.0,)) else LoadPointPlan(fracs, args.load_point_s)
    except ValueError as e:
        raise UsageError(f"--load-point {args.load_point!r} / --load-point-s: {e}") from None
    with tempfile.TemporaryDirectory(prefix="slobench-plan-") as tmp:
        if args.timing_target == "embedded":
            with EmbeddedEngine(engine_opts, log_path=Path(tmp) / "engine.log") as url:
                return _time_and_fit(url, settings, point, scn, eng, Path(tmp), None)
        if not args.timing_target.startswith(("http://", "https://")):
            raise UsageError(f"--calibrate {args.timing_target!r}: expected http://HOST:PORT or 'embedded'")
        return _time_and_fit(args.timing_target, settings, point, scn, eng, Path(tmp), scn.model)


def _time_and_fit(url: str, settings, point, scn, eng, work: Path, model: str | None):
    from loadgen.planning.load_point import run_load_points, scaled
    from loadgen.planning.planner import slos_of
    from loadgen.planning.step_timing import fit_step_times

    timed = fit_step_times(url, settings, work, model)
    if point is None:
        return timed
    try:
        def started(k: int, rate: float, n: int) -> None:
            print(f"load point {k + 1}/{len(point.fracs)}: {n} requests at {rate:.3g} req/s for "
                  f"{point.duration_s:g} s ...", file=sys.stderr, flush=True)

        points = run_load_points(url, scn, eng, timed.model, slos_of(scn), point, work, model, started)
    except ValueError as e:  # the target answered too little, or the fit predicts no load: a calibration failure
        raise RuntimeError(f"load point: {e} (--load-point 0 skips them)") from None
    timed.unscaled_model = timed.model
    timed.model = scaled(timed.model, points[-1].factor)
    timed.load_points = points
    timed.wall_s += sum(p.wall_s for p in points)
    return timed


def cmd_plan(args: argparse.Namespace) -> int:
    from loadgen.planning.requests import PlanError
    from loadgen.scenario.model import ScenarioError
    from loadgen.target.discovery import TargetError

    try:
        result = build(args)
    except (PlanError, ScenarioError) as e:
        raise UsageError(str(e)) from None
    except (TargetError, RuntimeError) as e:  # the probe's target failed (ProbeError, EngineStartError: RuntimeError)
        print(f"error: calibration failed: {str(e).splitlines()[0] if str(e) else type(e).__name__}", file=sys.stderr)
        return EXIT_FAIL
    print_plan(result)
    return EXIT_OK


def build(args: argparse.Namespace) -> dict:
    """Everything the command prints and writes, as one dict (the ``--json`` document)."""
    from loadgen.planning import hardware, theory
    from loadgen.planning.compare import compare, read_capacity_run
    from loadgen.planning.model_shape import dtype_bytes_of
    from loadgen.planning.planner import PlanInputs, make_plan, slos_of
    from loadgen.planning.requests import check_scenario
    from loadgen.planning.step_model import Roofline
    from loadgen.scenario.builtin import resolve_scenario
    from loadgen.scenario.parse import load_scenario

    if args.hardware is None and args.timing_target is None:
        raise UsageError("give --hardware NAME (or host) for the theory, --calibrate TARGET_URL for a fit, or both")
    for name, v, lo in (("--requests", args.requests, 100), ("--draws", args.draws, 1), ("--tp", args.tp or 1, 1)):
        if v < lo:
            raise UsageError(f"{name} must be >= {lo}, got {v}")
    if not 0 < args.mem_util <= 1 or args.overhead_ms < 0 or (args.target_rps is not None and args.target_rps <= 0):
        raise UsageError("need 0 < --mem-util <= 1, --overhead-ms >= 0 and --target-rps > 0")
    scn = load_scenario(resolve_scenario(args.scenario), args.set)  # a file, or a built-in's name
    check_scenario(scn)
    engine_opts = scn.engine_options(args.engine_opt)
    headroom = scn.headroom if args.headroom is None else args.headroom
    if not 0 <= headroom < 1:
        raise UsageError(f"--headroom must be in [0, 1), got {headroom}")
    host = (args.hardware or "").lower() == "host"
    dtype = args.dtype or engine_opts.get("dtype") or ("float32" if host or args.hardware is None else "bf16")
    try:
        dbytes = dtype_bytes_of(dtype)
        hw = None if args.hardware is None else (
            hardware.measure_host(int(engine_opts.get("num_threads") or 1), "float32" if dbytes == 4 else "bfloat16")
            if host else hardware.lookup(args.hardware))
    except (KeyError, ValueError) as e:
        raise UsageError(str(e).strip("'\"")) from None
    model_name = args.model or engine_opts.get("model") or "tiny"
    shape = resolve_model(str(model_name), dbytes)
    configured = "kv_cache_tokens" in engine_opts or "num_kv_blocks" in engine_opts
    from_memory = hw is not None and not host and not configured  # a real accelerator: the pool is its memory
    tp = args.tp or 1
    if from_memory and args.tp is None:
        need = scn.synthetic.input_len.longest + scn.synthetic.output_len.longest
        tp = theory.smallest_tp(shape.weights_bytes, shape.kv_bytes_per_token, hw.memory_bytes,
                                min(need, 1 << 20), args.mem_util) or 8
    pool = theory.kv_pool_tokens(shape.weights_bytes, shape.kv_bytes_per_token, hw.memory_bytes, tp,
                                 args.mem_util) if from_memory else None
    if pool == 0:
        raise UsageError(f"{shape.name}'s weights ({shape.weights_bytes / 1e9:.1f} GB) do not fit {tp} x {hw.name} "
                         f"at --mem-util {args.mem_util}: raise --tp")
    eng = engine_shape(engine_opts, pool)
    models: dict[str, Any] = {}
    if hw is not None:
        models["theory"] = Roofline(shape, hw, tp, args.overhead_ms / 1e3)
    step_time_fit = None
    if args.timing_target is not None:
        step_time_fit = fit_to_target(args, engine_opts, scn, eng)
        if step_time_fit.unscaled_model is not None:  # the probe's fit alone beside it: what the load points changed
            models["probe"] = step_time_fit.unscaled_model
        models["calibrated"] = step_time_fit.model
    inp = PlanInputs(scn, shape, eng, hw, tp, args.target_rps, headroom,
                     requests=args.requests, draws=args.draws, seed=scn.seed if args.seed is None else args.seed)
    plan = make_plan(inp, models)
    plan["calibration"] = step_time_fit.as_dict() if step_time_fit else None
    if args.capacity_run is not None:
        summary = read_capacity_run(args.capacity_run)
        preds = {k: m.pop("predictor") for k, m in plan["models"].items()}
        plan["comparison"] = compare(summary, preds, {k: m["rated_rps"] for k, m in plan["models"].items()})
    for m in plan["models"].values():
        m.pop("predictor", None)
    if args.capacity_run is not None:
        from loadgen.planning.compare import write_prediction
        from loadgen.report import auto_report

        print(f"prediction: {write_prediction(args.capacity_run, plan, slos_of(scn))}", file=sys.stderr)
        auto_report(args.capacity_run)  # the run's report, redrawn with the predicted curve
    if args.json:
        from loadgen.results.rundir import write_json

        args.json.parent.mkdir(parents=True, exist_ok=True)
        write_json(args.json, plan)
    if args.plot:
        from loadgen.planning.plot import write_plot

        args.plot.parent.mkdir(parents=True, exist_ok=True)
        write_plot(args.plot, {k: m["curve"] for k, m in plan["models"].items()}, slos_of(scn),
                   {k: m["rated_rps"] for k, m in plan["models"].items()}, plan.get("comparison"),
                   title=f"slobench plan: {scn.name}")
    return plan


def _fmt(v: Any, digits: int = 3) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}g}" if abs(v) < 1e6 else f"{v:.3e}"
    return str(v)


ROWS = (  # label, path into a model's entry
    ("weights (GB)", lambda m: m["closed_form"]["weights_bytes"] / 1e9),
    ("KV per token (bytes)", lambda m: m["closed_form"]["kv_bytes_per_token"]),
    ("KV pool (tokens)", lambda m: m["closed_form"]["kv_pool_tokens"]),
    ("KV per request, mean over life (tokens)", lambda m: m["closed_form"]["request_kv"]["mean_tokens"]),
    ("max batch by memory (mean / peak KV)",
     lambda m: f"{m['closed_form']['max_batch_by_memory']} / {m['closed_form']['max_batch_by_memory_peak']}"),
    ("batch (slots)", lambda m: m["closed_form"]["batch"]),
    ("decode step at batch 1 (ms)", lambda m: m["closed_form"]["decode_step_ms_batch_1"]),
    ("step at full batch (ms)", lambda m: m["closed_form"]["decode_step_ms"]),
    ("prefill, mean prompt (ms)", lambda m: m["closed_form"]["prefill_ms_mean_prompt"]),
    ("throughput at full batch (req/s)", lambda m: m["closed_form"]["throughput"]["requests_s"]),
    ("output tok/s at full batch", lambda m: m["closed_form"]["throughput"]["output_tokens_s"]),
    ("closed form: req/s within the TTFT SLO", lambda m: m["closed_form"]["slo_rps"]),
    ("simulated rated capacity (req/s)", lambda m: m["rated_rps"]),
    ("spec capacity, with headroom (req/s)", lambda m: m["spec_rps"]),
    ("per GPU: req/s", lambda m: m["per_gpu"]["req_s"]),
    ("per GPU: output tok/s", lambda m: m["per_gpu"]["output_tokens_s"]),
)


def print_plan(plan: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    names = list(plan["models"])
    hw = plan["hardware"]["name"] if plan["hardware"] else "calibrated only"
    t = Table(title=f"slobench plan: {plan['scenario']} | {plan['model']['name']} | {hw} | tp {plan['tp']}")
    t.add_column("figure")
    for n in names:
        t.add_column(n, justify="right")
    rows = list(ROWS)
    if plan.get("target_rps"):
        rows.append((f"replicas (GPUs) for {plan['target_rps']:g} req/s",
                     lambda m: f"{_fmt(m.get('replicas'))} ({_fmt(m.get('gpus'))})"))
    for label, get in rows:
        t.add_row(label, *[_fmt(get(plan["models"][n])) for n in names])
    cmp_ = plan.get("comparison")
    if cmp_:
        t.add_row("measured rated capacity (req/s)", *[_fmt(cmp_["measured_rated_rps"])] * len(names))
        t.add_row("error: predicted / measured - 1",
                  *[_fmt(cmp_["predicted"][n]["error"] * 100, 3) + " %" if cmp_["predicted"][n]["error"] is not None
                    else "-" for n in names])
    Console().print(t)
    cal = plan.get("calibration")
    if cal:
        print(f"calibration: {cal['wall_s']:.1f} s, {len(cal['observations'])} probe points ({cal['source']}), "
              f"fit rms error {cal['rel_rms'] * 100:.1f} %")
        for k, lp in enumerate(cal.get("load_points") or []):
            print(f"load point {k + 1}: {lp['sent']} requests at {lp['rate']:.3g} req/s for {lp['duration_s']:g} s "
                  f"({lp['frac']:g} x {lp['guide_rps']:.3g} req/s predicted): mean service {lp['measured_ms']:.1f} ms "
                  f"measured, {lp['simulated_probe_ms']:.1f} ms simulated on the probe's fit; "
                  f"fits at x{lp['factor']:.3f} ({lp['source']})")
