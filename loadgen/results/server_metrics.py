"""Each inference server's own Prometheus names: the histograms a breakdown is taken from, and the gauges
of its running batch, KV cache and queue. Which server a scraped page comes from is told by its metric
prefix (``vllm:``, ``sglang:``, ``tgi_``, ``trtllm_``), so no probe is needed.

The names, as each server's source defines them:

- vLLM (``vllm/v1/metrics/loggers.py``): ``vllm:request_{queue,prefill,decode}_time_seconds`` per
  request (queue: queued → first scheduled; prefill: scheduled → first token; decode: first → last token),
  the counter ``vllm:num_preemptions_total``. It exposes no ``max_num_seqs`` (``vllm:cache_config_info`` carries
  only the cache config).
- SGLang with ``--enable-metrics`` (``sglang/srt/metrics/collector.py``): ``sglang:queue_time_seconds``
  (scheduler queue), ``sglang:time_to_first_token_seconds`` and ``sglang:e2e_request_latency_seconds``
  (both from the request's arrival at the tokenizer manager), ``sglang:inter_token_latency_seconds``; no
  prefill or decode histogram. Gauges ``sglang:num_running_reqs``, ``sglang:num_queue_reqs``,
  ``sglang:token_usage`` (older versions also ``sglang:max_running_requests``); its preemptions are retractions,
  the counter ``sglang:num_retracted_requests_total`` (``sglang:num_retracted_reqs`` is the last batch's gauge).
- TGI (``router``, metrics-rs): ``tgi_request_{validation,queue,inference}_duration`` per request
  (inference: first scheduled → last token), ``tgi_request_mean_time_per_token_duration`` (inference /
  generated tokens), ``tgi_batch_inference_duration{method="prefill"|"decode"}`` per batch; gauges
  ``tgi_batch_current_size``, ``tgi_queue_size``. Its max batch size is not exposed, nor is any preemption.
- TensorRT-LLM's ``trtllm-serve`` (``tensorrt_llm/metrics/collector.py``), at ``/prometheus/metrics``
  (its ``/metrics`` is JSON iteration stats): ``trtllm_request_queue_time_seconds``,
  ``trtllm_time_to_first_token_seconds``, ``trtllm_e2e_request_latency_seconds``,
  ``trtllm_time_per_output_token_seconds``, and in newer releases
  ``trtllm_request_{prefill,decode}_time_seconds``; gauges ``trtllm_num_requests_{running,waiting}``,
  ``trtllm_kv_cache_utilization``, ``trtllm_max_batch_size_runtime`` / ``_static``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class ServerMetrics:
    """One server's names (histograms in seconds; ``None``: the server has none)."""

    server: str  # vllm | sglang | tgi | trtllm
    prefix: str
    queue: str | None = None  # per-request queue time
    prefill: str | None = None  # per-request prefill time
    decode: str | None = None  # per-request decode time (first token → last)
    ttft: str | None = None  # per-request server-side time to first token (queue included)
    e2e: str | None = None  # per-request server-side end to end
    inference: str | None = None  # per-request prefill + decode (TGI)
    prefill_batch: tuple[str, str] | None = None  # (histogram, label selector) of one prefill batch's time
    validation: str | None = None  # per-request front-end work before the queue (TGI)
    running: str | None = None  # gauge: requests in the running batch
    waiting: str | None = None  # gauge: requests queued
    kv_usage: tuple[str, ...] = ()  # gauges of KV cache use, 0..1
    max_running: tuple[str, ...] = ()  # gauges of the running batch's capacity (sequences), first found wins
    preemptions: tuple[str, ...] = ()  # counters of requests preempted for KV (swapped, recomputed, retracted)

    @property
    def source(self) -> str:
        return f"{self.server} histograms"


VLLM = ServerMetrics(
    "vllm", "vllm:", queue="vllm:request_queue_time_seconds", prefill="vllm:request_prefill_time_seconds",
    decode="vllm:request_decode_time_seconds", ttft="vllm:time_to_first_token_seconds",
    e2e="vllm:e2e_request_latency_seconds", inference="vllm:request_inference_time_seconds",
    running="vllm:num_requests_running", waiting="vllm:num_requests_waiting",
    kv_usage=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    preemptions=("vllm:num_preemptions_total", "vllm:num_preemptions"))
SGLANG = ServerMetrics(
    "sglang", "sglang:", queue="sglang:queue_time_seconds", ttft="sglang:time_to_first_token_seconds",
    e2e="sglang:e2e_request_latency_seconds", running="sglang:num_running_reqs", waiting="sglang:num_queue_reqs",
    kv_usage=("sglang:token_usage",), max_running=("sglang:max_running_requests",),
    preemptions=("sglang:num_retracted_requests_total",))  # not num_retracted_reqs: the last batch's gauge
TGI = ServerMetrics(
    "tgi", "tgi_", queue="tgi_request_queue_duration", inference="tgi_request_inference_duration",
    e2e="tgi_request_duration", prefill_batch=("tgi_batch_inference_duration", 'method="prefill"'),
    validation="tgi_request_validation_duration", running="tgi_batch_current_size", waiting="tgi_queue_size")
TRTLLM = ServerMetrics(
    "trtllm", "trtllm_", queue="trtllm_request_queue_time_seconds", prefill="trtllm_request_prefill_time_seconds",
    decode="trtllm_request_decode_time_seconds", ttft="trtllm_time_to_first_token_seconds",
    e2e="trtllm_e2e_request_latency_seconds", inference="trtllm_request_inference_time_seconds",
    running="trtllm_num_requests_running", waiting="trtllm_num_requests_waiting",
    kv_usage=("trtllm_kv_cache_utilization",),
    max_running=("trtllm_max_batch_size_runtime", "trtllm_max_batch_size_static"))

SERVERS: tuple[ServerMetrics, ...] = (VLLM, SGLANG, TGI, TRTLLM)
BY_NAME = {s.server: s for s in SERVERS}
PREFIXES: tuple[str, ...] = tuple(s.prefix for s in SERVERS)


def detect(sample: Mapping[str, float]) -> ServerMetrics | None:
    """The server whose names a scraped sample carries: the first (vLLM, SGLang, TGI, TRT-LLM) with a
    per-request histogram on the page, else the first with any series of its prefix, else None."""
    keys = list(sample)
    for s in SERVERS:
        hists = [h for h in (s.queue, s.prefill, s.decode, s.ttft, s.e2e, s.inference) if h]
        if any(k.startswith(h + "_count") for h in hists for k in keys):
            return s
    for s in SERVERS:
        if any(k.startswith(s.prefix) for k in keys):
            return s
    return None
