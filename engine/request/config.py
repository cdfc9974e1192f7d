"""Engine configuration: one dataclass, every knob the engine's design claims are measured with."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.request.tiers import TIERS


@dataclass
class EngineConfig:
    model: str = "tiny"  # a preset name or a local Hugging Face checkpoint folder
    device: str | None = None  # None: cuda when available, else cpu
    dtype: str | None = None  # None: float32 on cpu, bfloat16 on cuda
    seed: int = 0
    # CPU threads for torch. One by default: the load generator shares the machine, and OpenMP threads
    # spinning against a busy core made a tiny matmul 25x slower here (7 ms instead of 0.3 ms).
    num_threads: int | None = 1
    max_model_len: int | None = None  # None: the model's max_position_embeddings

    # Paged KV cache
    block_size: int = 16
    num_kv_blocks: int | None = None  # None: sized from kv_cache_tokens
    kv_cache_tokens: int = 65536  # KV capacity in tokens when num_kv_blocks is None
    num_host_blocks: int | None = None  # host (swap) pool; None: same as the device pool
    enable_prefix_caching: bool = True
    kv_allocation: str = "paged"  # "paged" | "contiguous" (baseline: reserve prompt + max_tokens)

    # Scheduler
    batching: str = "continuous"  # "continuous" | "static" (baseline: a batch starts and ends together)
    max_num_seqs: int = 64  # batch slots
    max_num_batched_tokens: int = 512  # per-step token budget
    enable_chunked_prefill: bool = True
    prefill_chunk_size: int = 256  # largest prefill chunk one request gets in a step
    # Queued requests join the batch every this many steps (and on every finish). Every step, as vLLM does: at 4
    # (the claim's "every 4-8 steps") a request waited up to 4 steps to join (mean TTFT 17.8 ms at 4 vs 12.0 ms at 1
    # in the rebatch-interval experiment), while scheduling costs ~1.3% of a step at any interval.
    rebatch_interval: int = 1
    # While a request's first token is out but its text is held back, the prefill chunks of requests ranked below
    # it wait (decodes go on): its remaining steps run short (engine/scheduler/scheduler.py)
    first_text_priority: bool = True
    premium_reserved_kv_frac: float = 0.0  # share of KV blocks only premium may use
    premium_reserved_slots: int = 0  # batch slots only premium may use
    max_waiting_per_tier: dict[str, int] = field(
        default_factory=lambda: {"premium": 256, "standard": 512, "basic": 1024}
    )
    kv_watermark: float = 0.9  # KV usage at which queued requests stop joining the batch and swapping starts
    # Admission (engine/core/admission.py): "slo" refuses (429) a request whose estimated queue wait would break
    # its tier's TTFT promise; "queue-length" only bounds each tier's queue (max_waiting_per_tier).
    admission: str = "slo"
    tier_ttft_slo_ms: dict[str, float] = field(default_factory=lambda: {"premium": 300.0, "standard": 800.0})
    admission_target_frac: float = 0.8  # admit while the TTFT estimate stays within this share of the promise
    # The longest a request of each tier waits unstarted (seconds; None: unbounded), in either admission mode: past
    # it, one that has shown its client nothing is shed (429 with Retry-After) rather than outwait the client. 60 s
    # is the timeout most clients and gateways run with; the TTFT promises bound premium and standard sooner.
    tier_max_queue_s: dict[str, float | None] = field(default_factory=lambda: dict.fromkeys(TIERS, 60.0))

    # Kernels
    # On the CPU, linear layers on weights oneDNN reordered once at load (engine/model/cpu_linear.py), not torch's
    # F.linear, which repacks every weight on every call.
    pack_cpu_weights: bool = True
    use_triton: bool | None = None  # None: on CUDA when triton imports
    # Decode steps on static, padded buffers replayed from CUDA graphs (engine/model/decode_graphs.py): "auto"
    # captures them on CUDA with the Triton kernel; "eager" runs the padded path uncaptured (any device, for
    # checking it); "off" never.
    decode_graphs: str = "auto"

    def __post_init__(self) -> None:
        if self.kv_allocation not in ("paged", "contiguous"):
            raise ValueError(f"kv_allocation must be 'paged' or 'contiguous', got {self.kv_allocation!r}")
        if self.batching not in ("continuous", "static"):
            raise ValueError(f"batching must be 'continuous' or 'static', got {self.batching!r}")
        if self.block_size <= 0 or self.max_num_seqs <= 0 or self.max_num_batched_tokens <= 0:
            raise ValueError("block_size, max_num_seqs and max_num_batched_tokens must be positive")
        if self.rebatch_interval < 1:
            raise ValueError("rebatch_interval must be at least 1")
        if not 0.0 < self.kv_watermark <= 1.0:
            raise ValueError("kv_watermark must be in (0, 1]")
        if self.decode_graphs not in ("auto", "off", "eager"):
            raise ValueError(f"decode_graphs must be 'auto', 'off' or 'eager', got {self.decode_graphs!r}")
        if self.admission not in ("slo", "queue-length"):
            raise ValueError(f"admission must be 'slo' or 'queue-length', got {self.admission!r}")
        if not 0.0 < self.admission_target_frac <= 1.0:
            raise ValueError("admission_target_frac must be in (0, 1]")
        if set(self.tier_ttft_slo_ms) - set(TIERS):
            raise ValueError(f"tier_ttft_slo_ms: unknown tiers {sorted(set(self.tier_ttft_slo_ms) - set(TIERS))}")
        if set(self.tier_max_queue_s) - set(TIERS):
            raise ValueError(f"tier_max_queue_s: unknown tiers {sorted(set(self.tier_max_queue_s) - set(TIERS))}")
        if any(v is not None and not v > 0 for v in self.tier_max_queue_s.values()):
            raise ValueError("tier_max_queue_s: each bound must be positive seconds, or None (unbounded)")
        if not 0.0 <= self.premium_reserved_kv_frac < 1.0:
            raise ValueError("premium_reserved_kv_frac must be in [0, 1)")

