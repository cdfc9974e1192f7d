"""The loadgen restructuring changed no behaviour: a fixed-seed ``slobench run loadgen/scenarios/smoke.yaml`` on
the embedded engine gives the summary keys and the request records (apart from times) that it gave
before it (``tests/fixtures/smoke-seed7-before-layout.json``, recorded from the code of commit efb25dd).
Keys added since are listed: the breakdown's network and mean TTFT (when its two schemas became one), the
prompt-length check, the scrape's own cost, what the probe found and how the requests were fitted in the
summary, the intended prompt length in each record."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import slobench

REPO = Path(__file__).resolve().parents[2]
BEFORE = json.loads((REPO / "tests" / "fixtures" / "smoke-seed7-before-layout.json").read_text())
ADDED = {"breakdown.mean_network_ms", "breakdown.p50_network_ms", "breakdown.p99_network_ms",
         "breakdown.mean_ttft_ms", "prompt_length", "scrape", "target_probe", "request_fit"}
ADDED_PREFIXES = ("prompt_length.", "scrape.", "target_probe.", "request_fit.", "prefix_cache.", "cancellations.",
                  "conversations.")
ADDED |= {"breakdown.source_detail", "prefix_cache", "cancellations", "conversations"}  # server semantics
ADDED_METRICS = ("ttfot", "chunk_gap")  # TTFOT and chunk gaps, overall and per tier (server semantics)
ADDED |= {f"breakdown.{s}_front_end_ms" for s in ("mean", "p50", "p99")}  # the front end's share (engine speed)
ADDED |= {f"breakdown.{s}_held_ms" for s in ("mean", "p50", "p99")}  # first token -> first text (overload)
ADDED |= {"schema_version"}  # outputs as an interface (docs/outputs.md)
ADDED |= {"outcomes", "retries"}  # outcome classes and resends of shed requests
ADDED_PREFIXES += ("outcomes.",)
ADDED_RECORD_FIELDS = {"prompt_tokens_intended", "first_output_s", "reasoning_tokens", "chunk_tokens",
                       "cached_tokens", "conversation", "turn", "cancel_reason", "retry_after_s", "retries"}
TIME = {"scheduled_s", "sent_s", "first_token_s", "token_s", "done_s", "server", "first_output_s"}
UNNESTED = ("versions", "machine", "argv", "errors", "errors_by_http_status", "scenario")


def keys(o: object, prefix: str = "") -> list[str]:
    out = []
    if isinstance(o, dict):
        for k, v in o.items():
            out.append(prefix + k)
            if k not in UNNESTED:
                out += keys(v, prefix + k + ".")
    return out


@pytest.mark.slow
def test_fixed_seed_smoke_run_gives_the_same_summary_keys_and_records(tmp_path):
    r = slobench("run", REPO / "loadgen" / "scenarios" / "smoke.yaml", "--seed", 7, "--out", tmp_path / "smoke",
                 "--no-progress", "--no-report", timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads((tmp_path / "smoke" / "summary.json").read_text())
    now_keys = {k for k in keys(summary) if k not in ADDED and not k.startswith(ADDED_PREFIXES)
                and not any(f"_{m}_ms" in k for m in ADDED_METRICS)
                and ".outcomes" not in k}  # each tier's outcome classes
    assert now_keys == set(BEFORE["summary_keys"])
    assert summary["prompt_length"]["flagged"] is False and summary["prompt_length"]["mean_abs_drift"] == 0
    recs = [json.loads(line) for line in (tmp_path / "smoke" / "requests.jsonl").read_text().splitlines()]
    # how many SSE chunks carried the tokens depends on timing (the server coalesces tokens that are ready
    # together), so token_s is left out with the other times; output_tokens (usage) is compared
    assert all(rec["prompt_tokens_intended"] == rec["prompt_tokens"] for rec in recs)  # token ids: exact
    now = sorted(({k: v for k, v in rec.items() if k not in TIME | ADDED_RECORD_FIELDS}
                  # source: server semantics; front_end_ms: engine speed; held_ms: overload
                  | {"server_keys": sorted(set(rec["server"] or {}) - {"source", "front_end_ms", "held_ms"})}
                  for rec in recs), key=lambda x: x["id"])
    assert now == BEFORE["records"]
