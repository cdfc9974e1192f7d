"""The benchmark suites: what each measures, with which scripts, in its full and its quick form.

A suite is a few parts; a part is one script of ``bench/`` run with fixed arguments. ``python -m bench
SUITE`` runs every part (or ``--part NAME``) and writes the suite's one current results file,
``bench/results/SUITE.json``: each part's result with the command, commit, date, machine and versions that
produced it. Rerunning a part replaces that part in the file (git keeps the history). ``--quick`` runs each
part small, to check that it works, and never writes ``bench/results/``. ``docs/validation.md`` cites the
suites' files part by part, and ``tests/bench/test_bench_suites.py`` checks its figures against them.

``needs`` names what a part needs beyond ``make setup``: ``vllm`` (vLLM's CPU build,
``../shared/tools/vllm-cpu``), ``guidellm`` and ``transformers-serve`` (installed by the part's script into
its own virtualenv), ``network`` (a package index), ``gpu``. Quick parts that need nothing are run by the tests.
"""

from __future__ import annotations

from dataclasses import dataclass

SCENARIOS = "loadgen/scenarios"


@dataclass(frozen=True)
class Part:
    name: str
    script: str  # in bench/
    about: str  # what it measures, one line
    args: tuple[str, ...] = ()  # the full measurement
    quick: tuple[str, ...] = ()  # a small run that checks the part works (its figures mean nothing)
    out_flag: str = "--json"  # the script's option naming its results file
    out_file: str | None = None  # where the option names a folder: the results file inside it
    needs: tuple[str, ...] = ()
    pin: str | None = None  # taskset's CPU list for the full measurement (the quick one runs unpinned)


@dataclass(frozen=True)
class Suite:
    name: str
    about: str
    parts: tuple[Part, ...]

    def part(self, name: str) -> Part:
        for p in self.parts:
            if p.name == name:
                return p
        raise KeyError(f"suite {self.name} has no part {name!r} (parts: {', '.join(p.name for p in self.parts)})")


CAPACITY_QUICK = ("--set", "search.step_duration_s=3", "--set", "search.max_duration_s=12",
                  "--set", "search.warmup_s=1")

SUITES: dict[str, Suite] = {s.name: s for s in (
    Suite("calibration", "the capacity search against a target of known capacity: accuracy and interval coverage", (
        Part("real-gradual", "calibration_bench.py", "`slobench calibrate` on the Poisson target (gradual knee), "
             "seeds 0-5: rated vs true, the interval's coverage", ("--seeds", *map(str, range(6)), "--floor-steps"),
             ("--seeds", "0", "--floor-steps", "--", *CAPACITY_QUICK), out_flag="--out"),
        Part("real-sharp", "calibration_bench.py", "the same on the paced target (sharp knee), seeds 0-7",
             ("--scenario", f"{SCENARIOS}/calibrate-steady.yaml", "--seeds", *map(str, range(8)), "--floor-steps"),
             ("--scenario", f"{SCENARIOS}/calibrate-steady.yaml", "--seeds", "0", "--floor-steps", "--",
              *CAPACITY_QUICK), out_flag="--out"),
        Part("simulated-gradual", "rating_simulation.py", "the default search and rating on the gradual target's "
             "queue computed exactly, 99 seeds: accuracy, spread, interval coverage; and with 20 refine windows",
             ("--designs", "fresh", "--refine", "20", "--no-floor"),
             ("--designs", "fresh", "--refine", "--no-floor", "--runs", "3"), out_flag="--out"),
        Part("simulated-sharp", "rating_simulation.py", "the same on the sharp target's queue",
             ("--scenario", f"{SCENARIOS}/calibrate-steady.yaml", "--designs", "fresh", "--refine", "--no-floor"),
             ("--scenario", f"{SCENARIOS}/calibrate-steady.yaml", "--designs", "fresh", "--refine", "--no-floor",
              "--runs", "3"), out_flag="--out"),
        Part("early-stop", "early_stop_bench.py", "the sequential test's false breaches at the threshold, simulated",
             (), ("--steps", "40", "--old-steps", "10")),
    )),
    Suite("capacity", "`slobench capacity` on the embedded reference engine, as a user runs it", (
        Part("seeds", "capacity_seeds_bench.py", "`slobench capacity chat`, seeds 1 2 3: ratings, intervals, spread",
             ("--seeds", "1", "2", "3"), ("--seeds", "1", *CAPACITY_QUICK), out_flag="--out"),
    )),
    Suite("client", "how accurately and how fast the load generator measures a target of exact timing", (
        Part("streaming", "client_accuracy_bench.py", "TTFT measured against a true 50 ms, by request rate",
             ("--mode", "streaming", "--rates", "200", "400", "600", "800"),
             ("--mode", "streaming", "--rates", "20", "--duration", "2", "--repeats", "1")),
        Part("scrape", "client_accuracy_bench.py", "what scraping a 1 MB /metrics page every second costs",
             ("--mode", "scrape", "--rates", "200", "--metrics-bytes", "1000000", "--repeats", "3"),
             ("--mode", "scrape", "--rates", "20", "--metrics-bytes", "10000", "--duration", "2", "--repeats", "1")),
        Part("replayer", "replayer_bench.py", "one replayer process's highest sustained request rate",
             ("--rates", "100", "150", "200", "300", "400", "500", "600", "--duration", "6"),
             ("--rates", "20", "--duration", "2")),
        Part("locust", "locust_bench.py", "one Locust worker's highest sustained request rate, beside the replayer",
             ("--rates", "150", "200", "300", "400", "--duration", "6"), ("--rates", "10", "--duration", "2")),
    )),
    Suite("engine", "the reference engine's serving techniques and its HTTP server, on the CPU", (
        Part("techniques", "engine_bench.py", "decode speed by batch, continuous vs static batching, paged KV",
             (), ("--requests", "16"), out_flag="--out"),
        Part("server", "server_bench.py", "the HTTP server's overhead over the engine, and its highest rate",
             ("--duration", "8"), ("--requests", "8", "--rates", "2", "--duration", "2")),
        Part("engine-core", "engine_core_bench.py", "the engine core as a process vs a thread, rated on chat",
             ("--repeats", "1"), ("--repeats", "1", "--modes", "thread", *CAPACITY_QUICK)),
    )),
    Suite("compare", "the reference engine and slobench beside third-party servers and tools", (
        Part("engine-speed", "engine_speed_bench.py", "useful output tokens/s beside vLLM and HF generate, "
             "prefix caching off on both, fresh prompts every repeat",
             ("--repeats", "3", "--vllm-python", "/tmp/venv_vllm/bin/python"), (), needs=("vllm",), pin="0"),
        Part("served", "engine_core_bench.py", "served and rated on chat beside `vllm serve`, one core each",
             ("--modes", "process", "vllm", "--model", "/tmp/tiny-llama"), (), needs=("vllm",)),
        Part("vllm-semantics", "vllm_semantics_bench.py", "vLLM's per-request breakdown vs its histograms; "
             "slobench beside `vllm bench serve`", ("--repeats", "3"), (), needs=("vllm",)),
        Part("vllm-tiers", "vllm_tiers_bench.py", "two tiers at an overload with priorities sent vs not; a queue "
             "cap's 503s rated with and without a shed budget", ("--repeats", "2"), (), needs=("vllm",)),
        Part("guidellm", "third_party_bench.py", "slobench beside GuideLLM against `transformers serve`",
             (), (), needs=("guidellm", "transformers-serve", "network")),
    )),
    Suite("plan", "`slobench plan`'s predictions against `slobench capacity`'s measured ratings", (
        Part("plan", "plan_bench.py", "predicted vs measured rated capacity on three scenarios", (),
             ("--scenarios", f"{SCENARIOS}/chat.yaml", "--capacity-set", "search.step_duration_s=3",
              "--capacity-set", "search.max_duration_s=12", "--capacity-set", "search.warmup_s=1",
              "--plan-arg=--load-point-s=4", "--plan-arg=--probe-rounds=2", "--plan-arg=--requests=1000",
              "--plan-arg=--draws=1"),
             out_flag="--out"),
    )),
    Suite("experiments", "the engine's serving claims, each judged as stated (`slobench experiments`)", (
        Part("experiments", "experiments_bench.py", "every experiment in its full form", (),
             ("chunked-prefill", "--reduced"),
             out_flag="--out", out_file="experiments.json"),
    )),
    Suite("overload", "the reference engine ten times past its rated load", (
        Part("overload", "overload_bench.py", "nothing lost, promises kept, goodput held at 10x the rated load",
             (), ("--rated", "10", "--rated-s", "3", "--overload-s", "3", "--factor", "3")),
    )),
    Suite("install", "what a new user's install costs", (
        Part("install", "install_bench.py", "the client alone, with the engine, and an empty virtualenv to a rating",
             (), (), out_flag="--out", needs=("network",)),
    )),
    Suite("gpu", "the engine on a GPU: parity, decode at constant batch against the roofline, prefill", (
        Part("gpu", "gpu_bench.py", "every GPU figure in one run", (), (), needs=("gpu",)),
    )),
)}
