"""Would `slobench gate`'s default capacity rule have flagged unchanged code? And does it see a real drop?

    python bench/gate_false_alarms.py [FILE[:pinned|:unpinned] ...] [--pool 1 2 3]
                                      [--json bench/results/gate-false-alarms.json]

Each FILE is a ``bench/capacity_seeds_bench.py`` results file: runs of one code in one sitting (``:pinned`` /
``:unpinned`` keeps only the runs with or without ``--pin``; ``A+B`` joins two files of one sitting). For
every ordered pair of its valid runs (one the baseline, the other the run), the gate's default rules for a
capacity run (``gate.rules``: ``within_intervals`` on ``rated_capacity.rate_rps``, and a valid run) are
evaluated on the two runs' ``rated_capacity`` exactly as ``slobench gate`` evaluates two summaries
(``gate.evaluate.evaluate_rule``). A failure there is a false alarm: nothing changed between the two runs but the seed.

``--pool N``: each side is N runs (``slobench gate RUN... --baseline B...``, pooled by ``gate.pool``): every
ordered pair of two disjoint N-run groups of a sitting that has at least 2N runs.

``--drop BASE=RUN`` pairs (repeatable) compare two groups that differ for a known reason (each a FILE[:filter]):
every N runs of RUN against every N runs of BASE. The defaults pair the pinned runs of
``capacity-seeds-pinned.json`` (the engine on one core: about a tenth less capacity) against the unpinned
ones of the same sitting: how often the rule sees that drop; and the 40 s steps' runs
(``capacity-seeds-40s-steps.json``, about a tenth lower: longer windows rate lower) against the five default
runs just before them (``capacity-seeds-more-seeds.json``).
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

from loadgen.gate.evaluate import evaluate_rule  # noqa: E402
from loadgen.gate.pool import pool  # noqa: E402
from loadgen.gate.rules import default_rules  # noqa: E402
from loadgen.results.runmeta import git_commit, now_iso  # noqa: E402

RESULTS = REPO / "bench" / "results"
SITTINGS = [  # the default runs of 2026-12-05 and of the idle-forget day: eight each, in one sitting
    "capacity-seeds-drawn-counts.json+capacity-seeds-more-seeds.json", "capacity-seeds-exact-counts.json",
    "capacity-seeds-40s-steps.json", "capacity-seeds-40s-steps-tail-floor-1.json",
    "capacity-seeds-idle-forget.json+capacity-seeds-idle-forget-more.json",
    "capacity-seeds-pinned.json:unpinned", "capacity-seeds-pinned.json:pinned",
    "capacity-seeds-probe.json", "capacity-seeds-profile-again.json", "capacity-seeds-profile.json",
]
DROPS = ["capacity-seeds-pinned.json:unpinned=capacity-seeds-pinned.json:pinned",
         "capacity-seeds-more-seeds.json=capacity-seeds-40s-steps.json"]


def summaries(spec: str) -> list[dict]:
    """The valid rated runs of ``FILE[:pinned|:unpinned][+FILE...]`` as the summaries the gate reads."""
    if "+" in spec:
        return [s for part in spec.split("+") for s in summaries(part)]
    name, _, which = spec.partition(":")
    path = Path(name) if Path(name).is_file() else RESULTS / name
    runs = json.loads(path.read_text())["runs"]
    if which:
        runs = [r for r in runs if bool(r.get("pinned")) == (which == "pinned")]
    out = []
    for r in runs:
        rc = r.get("rated_capacity")
        if not isinstance(rc, dict) or rc.get("rate_rps") is None:
            continue
        # the bench keeps the interval's fields; a rate-axis search's interval is of rate_rps
        out.append({"kind": "capacity", "valid": bool(r.get("valid")), "seed": r.get("seed"),
                    "rated_capacity": {**rc, "ci_of": "rate_rps"}})
    return out


def verdict(runs: tuple[dict, ...], bases: tuple[dict, ...]) -> dict:
    current = pool(list(runs), [f"seed {r['seed']}" for r in runs])
    baseline = pool(list(bases), [f"seed {r['seed']}" for r in bases])
    results = [evaluate_rule(rule, current, baseline) for rule in default_rules(current, baseline)]
    capacity = next(r for r in results if r.rule.metric == "rated_capacity.rate_rps")
    return {"baseline_seeds": [r["seed"] for r in bases], "run_seeds": [r["seed"] for r in runs],
            "baseline_rps": baseline["rated_capacity"]["rate_rps"], "run_rps": current["rated_capacity"]["rate_rps"],
            "flagged": any(r.status == "fail" for r in results), "capacity_rule": capacity.status,
            "bound": capacity.figures.get("bound"), "rule": capacity.figures.get("rule")}


def groups(runs: list[dict], n: int) -> list[tuple[dict, ...]]:
    return list(itertools.combinations(runs, n))


def disjoint(a: tuple[dict, ...], b: tuple[dict, ...]) -> bool:
    return not {id(x) for x in a} & {id(x) for x in b}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="*", default=SITTINGS)
    ap.add_argument("--drop", action="append", default=None, metavar="BASE=RUN")
    ap.add_argument("--pool", type=int, nargs="+", default=[1, 2, 3], help="runs per side (each N given)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    out: dict = {"bench": "gate_false_alarms", "when": now_iso(), "git_commit": git_commit(), "by_pool": {}}
    for n in args.pool:
        res: dict = {"sittings": {}, "drops": {}}
        total = flagged = 0
        for spec in args.files:
            runs = summaries(spec)
            pairs = [verdict(a, b) for b in groups(runs, n) for a in groups(runs, n) if disjoint(a, b)]
            k = sum(p["flagged"] for p in pairs)
            total, flagged = total + len(pairs), flagged + k
            if pairs:
                res["sittings"][spec] = {"runs": len(runs), "pairs": len(pairs), "flagged": k,
                                         "flagged_verdicts": [p for p in pairs if p["flagged"]]}
                print(f"{n} a side, {spec}: {len(runs)} runs, {k} of {len(pairs)} ordered pairs flagged", flush=True)
        res["false_alarms"] = {"pairs": total, "flagged": flagged, "rate": flagged / total if total else None}
        print(f"{n} a side, unchanged code: {flagged} of {total} ordered pairs flagged")
        for spec in args.drop or DROPS:
            base_spec, _, run_spec = spec.partition("=")
            pairs = [verdict(a, b) for b in groups(summaries(base_spec), n) for a in groups(summaries(run_spec), n)]
            k = sum(p["flagged"] for p in pairs)
            res["drops"][spec] = {"pairs": len(pairs), "flagged": k, "verdicts": pairs}
            print(f"{n} a side, {run_spec} against {base_spec}: {k} of {len(pairs)} pairs flagged")
        out["by_pool"][str(n)] = res
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
