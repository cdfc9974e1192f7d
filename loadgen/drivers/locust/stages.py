"""What a Locust run sends (``StagedLoad``): stages of request specs on one timeline, and how they are sharded.

Pure Python (no Locust import), so it is built identically on the master and on every worker: each
process loads the same scenario (or the spec file ``slobench run --driver locust`` writes) and gets the
same seeded schedule; a worker then keeps its shard, ``specs[index::count]``, exactly as
``slobench run --workers N`` shards the aiohttp replayer's schedule.

A stage is one load level. Open-loop stages (``rate``) carry a schedule; stage ``k`` starts at
``start_s`` on the run's timeline and its specs' ``arrival_s`` are already shifted by it. Closed-loop
stages (``concurrency``) carry a pool of specs that their users take in turn.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loadgen.scenario.parse import load_scenario
from loadgen.scenario.steps import step_specs
from loadgen.workload.exact_text import TextMaker
from loadgen.workload.specs import RequestSpec
from loadgen.workload.text_prompts import to_text
from loadgen.workload.tokenizer import WordTokenizer


@dataclass(slots=True)
class Stage:
    index: int
    axis: str  # "rate" (open loop) | "concurrency" (closed loop)
    load: float  # req/s or users
    start_s: float  # on the run's timeline
    duration_s: float | None  # None: until its specs are done
    specs: list[RequestSpec] = field(default_factory=list)
    cycle: bool = False  # closed loop with a duration: the users go round the pool until the stage ends

    @property
    def end_s(self) -> float:
        if self.duration_s is not None:
            return self.start_s + self.duration_s
        if self.axis == "rate" and self.specs:
            return self.specs[-1].arrival_s
        return self.start_s

    def describe(self) -> dict[str, Any]:
        return {"stage": self.index, "axis": self.axis, "load": self.load, "start_s": round(self.start_s, 6),
                "duration_s": self.duration_s, "planned": None if self.cycle else len(self.specs)}


@dataclass(slots=True)
class StagedLoad:
    """A Locust run's stages, with the model they ask for and the tiers' SLOs each stage is judged on."""

    stages: list[Stage]
    model: str | None = None
    tier_slos: dict[str, dict[str, float]] = field(default_factory=dict)
    name: str = "locust"
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def closed(self) -> bool:
        return bool(self.stages) and self.stages[0].axis == "concurrency"

    @property
    def planned(self) -> int | None:
        """Requests all the stages send, when that is known in advance (not for cycling pools)."""
        if any(s.cycle for s in self.stages):
            return None
        return sum(len(s.specs) for s in self.stages)

    def stage_at(self, t: float) -> Stage:
        cur = self.stages[0]
        for s in self.stages:
            if s.start_s <= t:
                cur = s
        return cur

    def schedule(self) -> list[tuple[int, RequestSpec]]:
        """Open loop: every (stage, spec) of the run in send order."""
        return [(s.index, sp) for s in self.stages for sp in s.specs]


def shard(items: list, index: int, count: int) -> list:
    """This process's share: ``items[index::count]`` (specs, or (stage, spec) pairs), except that a
    conversation with real history stays whole, with the process of its first turn."""
    if count <= 1:
        return list(items)
    groups: list[list] = []
    first_turn: dict[Any, list] = {}
    for it in items:
        sp = it[1] if isinstance(it, tuple) else it
        if sp.follow_up and (g := first_turn.get((sp.conversation, _stage(it)))) is not None:
            g.append(it)
            continue
        groups.append([it])
        if sp.conversation is not None:
            first_turn[(sp.conversation, _stage(it))] = groups[-1]
    mine = [it for g in groups[index::count] for it in g]
    return sorted(mine, key=lambda it: (_stage(it), (it[1] if isinstance(it, tuple) else it).arrival_s))


def _stage(item: Any) -> int:
    return item[0] if isinstance(item, tuple) else 0


# ------------------------------------------------------------------ building the stages


def write_specs(path: str | Path, specs: list[RequestSpec], *, concurrency: int = 0, model: str | None = None,
                tier_slos: dict | None = None, name: str = "run", stage: int = 0, start_s: float = 0.0,
                duration_s: float | None = None) -> Path:
    """The spec file that ``slobench run --driver locust`` (and a capacity step) hands to the locustfile:
    one fixed stage."""
    path = Path(path)
    payload = {"specs": list(specs), "concurrency": concurrency, "model": model, "tier_slos": tier_slos or {},
               "name": name, "stage": stage, "start_s": start_s, "duration_s": duration_s}
    with open(path, "wb") as f:
        pickle.dump(payload, f, protocol=pickle.HIGHEST_PROTOCOL)
    return path


def staged_load_from_specs_file(path: str | Path) -> StagedLoad:
    with open(path, "rb") as f:
        d = pickle.load(f)  # noqa: S301 (a file this program wrote for its own child process)
    return staged_load_from_specs(d["specs"], concurrency=d.get("concurrency", 0), model=d.get("model"),
                           tier_slos=d.get("tier_slos"), name=d.get("name", "run"), stage=d.get("stage", 0),
                           start_s=d.get("start_s", 0.0), duration_s=d.get("duration_s"))


def staged_load_from_specs(specs: list[RequestSpec], *, concurrency: int = 0, model: str | None = None,
                           tier_slos: dict | None = None, name: str = "run", stage: int = 0, start_s: float = 0.0,
                           duration_s: float | None = None) -> StagedLoad:
    """One fixed stage of given specs: open loop on their ``arrival_s`` (on the run's timeline), or closed
    loop with ``concurrency`` users (until the specs are done, or round them until ``duration_s`` ends)."""
    if concurrency:
        st = Stage(stage, "concurrency", concurrency, start_s, duration_s, list(specs), cycle=duration_s is not None)
    else:
        span = (specs[-1].arrival_s - specs[0].arrival_s) if specs else 0.0
        rate = (len(specs) - 1) / span if span > 0 else float(len(specs))
        st = Stage(stage, "rate", rate, start_s, duration_s, list(specs))
    return StagedLoad([st], model=model, tier_slos=dict(tier_slos or {}), name=name)


def history_as_text(specs: list[RequestSpec]) -> None:
    """A locustfile run has no target probe (``target.prepare``): conversations with real history go as text
    completions, lengths about one token per word (a reply's token ids are not known, so no token ids)."""
    if any(s.follow_up for s in specs):
        to_text(specs, TextMaker(WordTokenizer()))


def parse_steps(text: str | None) -> list[float]:
    if not text:
        return []
    try:
        out = [float(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise ValueError(f"--slobench-steps: expected comma-separated numbers, got {text!r}") from None
    if not out or any(not x > 0 for x in out):
        raise ValueError(f"--slobench-steps: loads must be > 0, got {text!r}")
    return out


def staged_load_from_scenario(path: str | Path, *, steps: list[float] | None = None, step_s: float | None = None,
                              seed: int | None = None, model: str | None = None) -> StagedLoad:
    """A scenario file as stages. Without ``steps``: its ``load`` section, one stage, the same specs as
    ``slobench run``. With ``steps`` (loads on the scenario's axis: req/s for open-loop arrivals, users for
    ``closed``): one stage of ``step_s`` seconds per load, each sending what a capacity step at that load
    sends (``scenario.steps.step_specs``: one arrival pattern scaled to each load, fresh prompts)."""
    scn = load_scenario(path)
    if seed is not None:
        scn.seed = seed
        if scn.trace_options:
            scn.trace_options.seed = seed
    closed = bool(scn.arrivals and scn.arrivals.closed)
    base = dict(model=model or scn.model, tier_slos=scn.tier_slos, name=scn.name)
    if not steps:
        specs, info = scn.build()
        history_as_text(specs)
        staged = staged_load_from_specs(specs, concurrency=scn.arrivals.concurrency if closed else 0, **base)
        staged.meta = {"scenario": str(path), "workload": info}
        return staged
    if not step_s or not step_s > 0:
        raise ValueError("a ramp (--slobench-steps) needs --slobench-step-s > 0")
    stages = []
    axis = "concurrency" if closed else "rate"
    for k, load in enumerate(steps):  # each stage sends what a capacity step at that load sends
        start = k * step_s
        specs = step_specs(scn, axis, load, k, start, step_s)
        history_as_text(specs)
        stages.append(Stage(k, axis, int(load) if closed else load, start, step_s, specs, cycle=closed))
    return StagedLoad(stages, meta={"scenario": str(path), "steps": steps, "step_s": step_s}, **base)
