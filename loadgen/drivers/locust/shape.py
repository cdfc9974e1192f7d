"""The load shape and the run's control on the master.

:class:`SLORampShape` is a ``LoadTestShape``: Locust ticks it once a second on the master (or the single
process). It starts the run (picks the start instant and each worker's shard, and tells the workers
with a custom message), steps the load through the staged load's stages (one driver user per sending process
for open-loop stages, N users for closed-loop ones), judges each stage's TTFT SLO on the records the
master has gathered, and ends the run: when everything planned was sent and every record is in, when
the drain time after the last send runs out, or as soon as a tier's TTFT SLO is broken, which sets the
process exit code (``--slobench-slo-exit-code``, 3 by default).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from locust import LoadTestShape
from locust.runners import MasterRunner

from loadgen.drivers.locust.collect import Collector
from loadgen.drivers.locust.stages import StagedLoad
from loadgen.drivers.locust.users import STATE, ClosedLoopUser, OpenLoopDriver, apply_client_settings, client_config
from loadgen.results.rundir import write_summary
from loadgen.target.access import check_target

log = logging.getLogger("slobench.locust")

MSG_START, MSG_STOP = "slobench_start", "slobench_stop"


class Control:
    """The master's state for one run (one per process; reset when a run starts again from the web UI)."""

    def __init__(self) -> None:
        self.env = None
        self.opts: dict[str, Any] = {}
        self.staged: StagedLoad | None = None
        self.build_s = 0.0
        self.reset()

    def reset(self) -> None:
        self.collector: Collector | None = None
        self.t0_wall: float | None = None
        self.t0_mono = 0.0
        self.nodes = 1
        self.stopping_since: float | None = None
        self.stop_reason: str | None = None
        self.breach: dict[str, Any] | None = None
        self.judged: dict[int, dict[str, Any]] = {}
        self.finished = False
        self.last_tick: tuple = (0, 1.0, [OpenLoopDriver])

    # -------------------------------------------------------------- start

    def start(self, runner) -> None:
        env = self.env
        self.reset()
        if not (self.staged.model or self.opts.get("model")) and not env.host:
            raise RuntimeError("no --host given (the target's base URL)")
        key = self.opts.get("api_key")
        headers = {**({"Authorization": f"Bearer {key}"} if key else {}), **(self.opts.get("headers") or {})}
        model = self.staged.model or self.opts.get("model") or check_target(env.host, None, headers)
        self.opts["model"] = model
        out = Path(self.opts["out"])
        self.collector = Collector(out, self.staged, float(self.opts.get("slo_quantile") or 0.99),
                                   float(self.opts.get("warmup_s") or 0.0))
        distributed = isinstance(runner, MasterRunner)
        lead = (1.0 + 2.0 * self.build_s) if distributed else 0.2
        if self.opts.get("t0"):  # the caller's clock (same machine): records come out on its time axis
            self.t0_mono = float(self.opts["t0"])
            self.t0_wall = time.time() + (self.t0_mono - time.monotonic())
        else:
            self.t0_wall = time.time() + lead
            self.t0_mono = time.monotonic() + lead
        if distributed:
            ids = sorted(c.id for c in runner.clients.values())
            self.nodes = len(ids)
            runner.send_message(MSG_START, {"t0_wall": self.t0_wall, "shards": {cid: i for i, cid in enumerate(ids)},
                                            "count": len(ids), "opts": self.opts})
        else:
            self.nodes = 1
            start_sending(self.staged, 0, 1, self.t0_wall, self.opts, env)
        (out / "start.json").write_text(json.dumps({"t0_wall": self.t0_wall, "t0_mono": self.t0_mono,
                                                    "nodes": self.nodes, "model": model,
                                                    "stages": [s.describe() for s in self.staged.stages]}) + "\n")
        log.info("slobench: %d stage(s), %s requests planned, %d sending process(es), model %s",
                 len(self.staged.stages), self.staged.planned if self.staged.planned is not None else "open-ended",
                 self.nodes, model)

    def poll_local(self) -> None:
        if self.collector is not None and self.nodes == 1 and not isinstance(self.env.runner, MasterRunner):
            self.collector.feed("local", STATE.tally.report())

    # -------------------------------------------------------------- stop

    def stop_sending(self, reason: str, cancel: bool) -> None:
        if self.stopping_since is None:
            self.stopping_since = time.monotonic()
            self.stop_reason = reason
            log.warning("slobench: %s", reason)
        runner = self.env.runner
        if isinstance(runner, MasterRunner):
            runner.send_message(MSG_STOP, {"cancel": cancel})
        else:
            stop_local(cancel)

    # -------------------------------------------------------------- each tick

    def tick(self) -> tuple | None:
        self.poll_local()
        t = time.monotonic() - self.t0_mono
        col = self.collector
        staged = self.staged
        q = float(self.opts.get("slo_quantile") or 0.99)
        # judge stages: a final verdict once a stage's requests are all in, a certain breach any time
        for pos, st in enumerate(staged.stages):
            if st.index in self.judged or t < st.start_s:
                continue
            if st.axis == "rate" and not st.cycle:  # open loop: the stage's size is known
                complete = col.gathered_by_stage.get(st.index, 0) >= len(st.specs)
            else:  # closed loop: every send reported (a report comes each second) and its record in
                complete = t >= st.end_s + 1.5 and col.stage_complete(st.index) and (
                    pos + 1 < len(staged.stages) or col.totals()["finished"])
            final = t >= st.end_s and complete
            js = col.judge(st.index, final)
            if final:
                self.judged[st.index] = {**st.describe(), "slo": [j.as_dict() for j in js],
                                         "passed": not any(j.broken for j in js)}
            broken = [j for j in js if j.broken]
            if broken and self.breach is None and self.opts.get("stop_on_slo", True):
                b = broken[0]
                val = f"{b.value_ms:.1f} ms" if b.value_ms is not None else "failed requests"
                self.breach = {"stage": st.index, "load": st.load, "axis": st.axis, "tier": b.tier,
                               "quantile": "mean" if b.statistic == "mean" else q, "value_ms": b.value_ms,
                               "threshold_ms": b.threshold_ms,
                               "certain_early": b.certain}
                self.stop_sending(f"TTFT SLO broken at stage {st.index} ({st.axis} {st.load:g}): tier {b.tier} "
                                  f"{'mean' if b.statistic == 'mean' else f'p{100 * q:g}'} TTFT {val} > "
                                  f"{b.threshold_ms:g} ms", cancel=True)
        end = max((s.end_s for s in staged.stages), default=0.0)
        drain_s = float(self.opts.get("drain_s") or 60.0)
        if self.stopping_since is None and t >= end + drain_s and not col.all_in(self.nodes):
            self.stop_sending(f"requests still in flight {drain_s:g}s after the last send: cancelled", cancel=True)
        if col.all_in(self.nodes) and (t >= end or self.stopping_since is not None):
            return self.finish()
        if self.stopping_since is not None and time.monotonic() - self.stopping_since > 10.0:
            log.error("slobench: records still missing 10 s after the stop; ending anyway")
            return self.finish()
        if self.stopping_since is not None:
            return self._hold()
        st = staged.stage_at(max(t, 0.0))
        if st.axis == "concurrency":
            n = int(st.load)
            self.last_tick = (n, float(min(max(n, 1) * 10, 100 * self.nodes)), [ClosedLoopUser])
        else:
            self.last_tick = (self.nodes, float(self.nodes * 10), [OpenLoopDriver])
        return self.last_tick

    def _hold(self) -> tuple:
        """While stopping: the same users as before (a changed tick would re-dispatch users)."""
        return self.last_tick

    def finish(self) -> None:
        if not self.finished:
            self.finished = True
            self.poll_local()
            t = time.monotonic() - self.t0_mono
            for st in self.staged.stages:  # stages still open: judged on everything that came in
                if st.index not in self.judged and t >= st.start_s:
                    js = self.collector.judge(st.index, final=True)
                    self.judged[st.index] = {**st.describe(), "slo": [j.as_dict() for j in js],
                                             "passed": not any(j.broken for j in js)}
            self.write_outputs()
        return None

    def write_outputs(self) -> None:
        col = self.collector
        if col is None:
            return
        self.poll_local()
        totals = col.totals()
        if self.breach is not None:
            self.env.process_exit_code = int(self.opts.get("slo_exit_code") or 3)
        passed = [s for s in self.judged.values() if s["passed"]]
        verdict = {
            "stages": [self.judged.get(s.index, {**s.describe(), "slo": None, "passed": None})
                       for s in self.staged.stages],
            "slo_broken": self.breach,
            "highest_passing_load": max((s["load"] for s in passed), default=None),
            "stopped": self.stop_reason,
            "totals": totals,
            "planned": self.staged.planned,
        }
        (col.out_dir / "locust_stages.json").write_text(json.dumps(verdict, indent=2, default=str) + "\n")
        col.close()
        if self.opts.get("summary", True):
            from loadgen.results.records import read_records
            from loadgen.results.summary import summarize

            s = summarize(read_records(col.req_path), tier_slos=self.staged.tier_slos)
            s.update(run_id=col.out_dir.name, driver="locust", model=self.opts.get("model"),
                     requests_planned=self.staged.planned, stopped_early=self.stop_reason, locust=verdict)
            write_summary(col.out_dir, s)
        log.info("slobench: %d records gathered (%d sent) in %s", totals["gathered"], totals["sent"], col.out_dir)

    def status(self) -> dict[str, Any]:
        """For the web UI route and for tests."""
        col = self.collector
        return {"totals": col.totals() if col else None, "judged": self.judged, "slo_broken": self.breach,
                "stopped": self.stop_reason, "t": time.monotonic() - self.t0_mono if self.t0_wall else None}


CONTROL = Control()


def start_sending(staged: StagedLoad, index: int, count: int, t0_wall: float, opts: dict[str, Any], env) -> None:
    cfg = client_config(opts)
    apply_client_settings(cfg)
    STATE.start(staged, index, count, t0_wall, cfg, opts["model"], env.events)


def stop_local(cancel: bool) -> None:
    STATE.stop_sending = True
    if cancel:
        STATE.cancel_in_flight()


class SLORampShape(LoadTestShape):
    """Steps the load through the staged load's stages; ends the run when it is done or the TTFT SLO breaks."""

    def tick(self):
        if CONTROL.collector is None or CONTROL.finished:  # the first tick of a run (again, from the web UI)
            CONTROL.start(self.runner)
        return CONTROL.tick()
