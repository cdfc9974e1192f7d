"""Record gathering and the SLO judgement, on the master (no Locust import).

Each process that sends requests keeps a :class:`Tally` (counters plus an outbox of finished records as
``requests.jsonl`` lines). A worker empties it into every report it sends to the master
(``events.report_to_master``); the master feeds each report to its :class:`Collector`
(``events.worker_report``), which appends the lines to ``requests.jsonl``, sums the counters over
workers, and judges each stage's TTFT SLO from the records themselves. In a single process the
collector takes the local tally directly.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from loadgen.drivers.locust.stages import StagedLoad
from loadgen.results import latency
from loadgen.results.slo import slo_key

COUNTERS = ("sent", "done", "in_flight", "ok", "errors", "output_tokens")


@dataclass(slots=True)
class Tally:
    """One sending process's counters and finished records not yet handed on."""

    sent: int = 0
    done: int = 0
    in_flight: int = 0
    ok: int = 0
    errors: int = 0
    output_tokens: int = 0
    late_max_ms: float = 0.0
    finished: bool = False  # this process will send nothing more
    cpu0: float = field(default_factory=time.process_time)  # CPU time of this process when the run started
    sent_by_stage: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    outbox: list[str] = field(default_factory=list)

    def report(self) -> dict[str, Any]:
        """Counters (cumulative) and the records finished since the last report (drained)."""
        lines, self.outbox = self.outbox, []
        return {"counters": {k: getattr(self, k) for k in COUNTERS}, "late_max_ms": self.late_max_ms,
                "cpu_s": time.process_time() - self.cpu0,
                "finished": self.finished, "sent_by_stage": dict(self.sent_by_stage), "records": lines}


@dataclass(slots=True)
class TierJudgement:
    tier: str
    threshold_ms: float
    n: int
    value_ms: float | None  # the quantile (or the mean); None when no request, inf as None too (see ``broken``)
    broken: bool
    certain: bool  # decided before the stage's requests were all in: over-threshold count already too high
    statistic: str = "quantile"  # quantile | mean (a ``ttft_ms@mean`` SLO)

    def as_dict(self) -> dict[str, Any]:
        return {"tier": self.tier, "threshold_ms": self.threshold_ms, "n": self.n, "value_ms": self.value_ms,
                "broken": self.broken, "certain": self.certain, "statistic": self.statistic}


def bucket_3_significant(response_time: float) -> float:
    """Locust's histogram key for a response time (ms) at 3 significant digits (147.3 -> 147,
    14.73 -> 14.7, 1473 -> 1470), so a percentile read from the histogram is within ±0.5%; Locust's own
    ``bucket_response_time`` keeps 2 (147 -> 150: up to ±5%)."""
    if response_time <= 0:
        return 0
    digits = 2 - math.floor(math.log10(response_time))
    return round(response_time, digits) if digits > 0 else int(round(response_time, digits))


class Collector:
    """The master's view: every record (written to ``requests.jsonl`` as it arrives), counters summed
    over the sending processes, and per-stage TTFT samples for the SLO."""

    def __init__(self, out_dir: str | Path, staged: StagedLoad, quantile_: float = 0.99, warmup_s: float = 0.0):
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.req_path = self.out_dir / "requests.jsonl"
        self.req_path.unlink(missing_ok=True)
        self._fd = os.open(self.req_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.staged = staged
        self._stages = {st.index: st for st in staged.stages}
        self.q = quantile_
        self.warmup_s = warmup_s
        self.gathered = 0
        self.gathered_by_stage: dict[int, int] = defaultdict(int)
        self.nodes: dict[str, dict[str, Any]] = {}
        # stage -> tier -> TTFT ms of judged requests (inf: failed before a first token)
        self.ttft: dict[int, dict[str | None, list[float]]] = defaultdict(lambda: defaultdict(list))
        # stage -> tier -> requests planned inside the judged window (open loop), for an early verdict
        self.window: dict[int, dict[str | None, int]] = defaultdict(lambda: defaultdict(int))
        for st in staged.stages:
            if not st.cycle:
                for sp in st.specs:
                    if sp.arrival_s >= st.start_s + warmup_s:
                        self.window[st.index][sp.tier] += 1

    # -------------------------------------------------------------- intake

    def feed(self, node_id: str, report: dict[str, Any]) -> None:
        lines = report.get("records") or []
        if self._fd < 0:  # the run was already written out
            return
        if lines:
            os.write(self._fd, ("\n".join(lines) + "\n").encode())
            for line in lines:
                self._take(json.loads(line))
        self.gathered += len(lines)
        self.nodes[node_id] = {k: report.get(k) for k in ("counters", "late_max_ms", "finished", "sent_by_stage",
                                                          "cpu_s")}

    def _take(self, r: dict[str, Any]) -> None:
        k = r["stage"]
        self.gathered_by_stage[k] += 1
        st = self._stages.get(k)
        if st is None or r["scheduled_s"] < st.start_s + self.warmup_s:
            return
        # the SLO rule of latency.slo_value: a 429 or an error counts as inf, a request cut off at the end as
        # the time it had waited (a lower bound), as in the capacity search
        self.ttft[k][r["tier"]].append(latency.slo_value(r, "ttft_ms"))

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    # -------------------------------------------------------------- totals

    def totals(self) -> dict[str, Any]:
        out: dict[str, Any] = {k: 0 for k in COUNTERS}
        by_stage: dict[int, int] = defaultdict(int)
        late = 0.0
        for n in self.nodes.values():
            for k in COUNTERS:
                out[k] += (n.get("counters") or {}).get(k, 0)
            for s, c in (n.get("sent_by_stage") or {}).items():
                by_stage[int(s)] += c
            late = max(late, n.get("late_max_ms") or 0.0)
        out["late_max_ms"] = late
        out["cpu_s_by_process"] = [round(n.get("cpu_s") or 0.0, 3) for n in self.nodes.values()]
        out["sent_by_stage"] = dict(by_stage)
        out["gathered"] = self.gathered
        out["workers"] = len(self.nodes)
        out["finished"] = bool(self.nodes) and all(n.get("finished") for n in self.nodes.values())
        return out

    def all_in(self, expected_nodes: int) -> bool:
        """Every sending process has finished and every record it sent has reached the master."""
        t = self.totals()
        return t["workers"] >= expected_nodes and t["finished"] and t["gathered"] >= t["sent"]

    def stage_complete(self, k: int) -> bool:
        sent = self.totals()["sent_by_stage"].get(k, 0)
        return self.gathered_by_stage.get(k, 0) >= sent

    # -------------------------------------------------------------- SLO

    def judge(self, k: int, final: bool) -> list[TierJudgement]:
        """The TTFT SLO of each tier that has one (its quantile, or its mean: ``ttft_ms@mean``), on stage
        ``k``'s judged window. ``final``: all its requests are in; otherwise only a breach that is already
        certain is reported as broken."""
        out = []
        for tier, slo in self.staged.tier_slos.items():
            for key in ("ttft_ms", slo_key("ttft_ms", "mean")):
                if key in slo:
                    out.append(self._judge_tier(k, tier, float(slo[key]), key != "ttft_ms", final))
        return out

    def _judge_tier(self, k: int, tier: str, thr: float, mean: bool, final: bool) -> TierJudgement:
        vals = self.ttft[k].get(tier, [])
        planned = self.window[k].get(tier, 0)
        if mean:  # what is in already, over all the planned requests (the rest at 0 ms), is a lower bound
            certain = planned > 0 and sum(vals) / max(planned, len(vals)) > thr
        else:  # no later request can save it
            certain = planned > 0 and sum(1 for v in vals if v > thr) > (1.0 - self.q) * planned
        statistic = "mean" if mean else "quantile"
        if not vals:
            return TierJudgement(tier, thr, 0, None, False, False, statistic)
        val = float(np.mean(vals)) if mean else latency.quantile(vals, self.q)
        broken = (val > thr) if final else certain
        return TierJudgement(tier, thr, len(vals), val if math.isfinite(val) else None, broken, certain and not final,
                             statistic)
