"""Where the plan's load points find the engine slower than the probe's fit: prefill or decode?

    python bench/load_point_parts.py [--scenarios loadgen/scenarios/long-prompt-burst.yaml ...] [--rates 5 10 15]
                                     [--duration-s 20] [--out bench/results/load-point-parts.json]

For each scenario: its embedded engine is started, the plan's probe fits the step-time model
(``planning.probe.calibrate``, as ``slobench plan --calibrate embedded`` does), and then the scenario's own
requests are sent open loop at each rate for ``--duration-s`` (one fresh arrival draw per rate, as a load point
sends them). The same requests are simulated with the probe's fit (``planning.simulate``), and the server's own
timing of each answered request is set beside the simulation's, part by part: the queue (arrival to joining the
batch), the prefill (joining the batch to the first token) and the decode (first token to last). The load
point's factor is fitted on prefill + decode together (``planning.load_point``), one factor for every
coefficient of the model. This bench shows how much of that factor comes from each part.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]

from loadgen.commands import plan as plan_command  # noqa: E402
from loadgen.drivers.event_loop import run_sync  # noqa: E402
from loadgen.drivers.http_request import ClientConfig  # noqa: E402
from loadgen.planning.load_point import send_open_loop  # noqa: E402
from loadgen.planning.probe import calibrate  # noqa: E402
from loadgen.planning.requests import requests_of  # noqa: E402
from loadgen.planning.simulate import simulate  # noqa: E402
from loadgen.results.records import read_records  # noqa: E402
from loadgen.results.runmeta import git_commit, machine, now_iso, versions  # noqa: E402
from loadgen.scenario.parse import load_scenario  # noqa: E402
from loadgen.scenario.steps import step_specs  # noqa: E402
from loadgen.target.embedded import EmbeddedEngine  # noqa: E402
from loadgen.target.prepare import TargetOptions, prepare_target  # noqa: E402

PARTS = ("queue", "prefill", "decode")


def parts(url: str, scn, eng, model, rate: float, index: int, duration_s: float, work: Path) -> dict:
    """One rate: the measured and simulated mean of each part (ms) over the requests both answered."""
    specs = step_specs(scn, "rate", rate, index, 0.0, duration_s, draw=index + 1)
    prepared = prepare_target(url, None, specs, TargetOptions())
    prepared.adapt(specs)
    cfg = ClientConfig(url, model=prepared.model, shape=prepared.shape)
    path = work / f"rate-{index}.jsonl"
    run_sync(lambda: send_open_loop(cfg, specs, path))
    answered = {r["id"]: r["server"] for r in read_records(path) if r.get("status") == "ok" and r.get("server")}
    sim = simulate(requests_of(specs), 1.0, eng, model)
    measured, simulated = [], []
    for i, spec in enumerate(specs):
        sv = answered.get(spec.id)
        if sv is None or sim.rejected[i] or sv.get("decode_ms") is None:
            continue
        measured.append((sv.get("queue_ms") or 0.0, sv["prefill_ms"], sv["decode_ms"]))
        simulated.append(((sim.start_s[i] - sim.arrive[i]) * 1e3, (sim.first_s[i] - sim.start_s[i]) * 1e3,
                          (sim.done_s[i] - sim.first_s[i]) * 1e3))
    m, s = np.mean(measured, axis=0), np.mean(simulated, axis=0)
    return {"rate": rate, "sent": len(specs), "compared": len(measured),
            "measured_ms": dict(zip(PARTS, m.tolist(), strict=True)),
            "simulated_ms": dict(zip(PARTS, s.tolist(), strict=True)),
            "ratio": {**{p: float(m[k] / s[k]) for k, p in enumerate(PARTS) if s[k] > 0},
                      "service": float((m[1] + m[2]) / (s[1] + s[2]))}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenarios", type=Path, nargs="+", default=[REPO / "loadgen" / "scenarios" / name for name in
                                                                  ("long-prompt-burst.yaml", "customer-service.yaml")])
    ap.add_argument("--rates", type=float, nargs="+", default=[5.0, 10.0, 15.0])
    ap.add_argument("--duration-s", type=float, default=20.0)
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "load-point-parts.json")
    args = ap.parse_args()
    sub = argparse.ArgumentParser().add_subparsers()
    plan_command.register(sub)
    out = {"bench": "load_point_parts", "when": now_iso(), "git_commit": git_commit(), "machine": machine(),
           "versions": versions(), "rates": args.rates, "duration_s": args.duration_s, "scenarios": {}}
    for path in args.scenarios:
        t0 = time.monotonic()
        scn = load_scenario(path)
        opts = scn.engine_options([])
        eng = plan_command.engine_shape(opts, None)
        cli = sub.choices["plan"].parse_args([str(path), "--calibrate", "embedded"])
        probe = plan_command.probe_plan(cli, eng.prefill_chunk_size if eng.enable_chunked_prefill else None,
                                        scn.synthetic.input_len.longest)
        with tempfile.TemporaryDirectory() as tmp, EmbeddedEngine(opts, log_path=Path(tmp) / "engine.log") as url:
            cal = calibrate(url, probe, Path(tmp), None)
            rows = []
            for k, rate in enumerate(args.rates):
                rows.append(parts(url, scn, eng, cal.model, rate, k, args.duration_s, Path(tmp)))
                r = rows[-1]["ratio"]
                print(f"{path.name} at {rate:g} req/s: measured / simulated: queue {r.get('queue', 0):.2f}, prefill "
                      f"{r['prefill']:.2f}, decode {r['decode']:.2f}, prefill + decode {r['service']:.2f}", flush=True)
        out["scenarios"][path.name] = {"probe_fit": dataclasses.asdict(cal.model), "points": rows,
                                       "wall_s": round(time.monotonic() - t0, 1)}
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
