"""The SLO admission's constants: how fast its measured rates move, how its tail factor learns and forgets.

Plain data (no torch): the engine's admission (engine/core/admission.py) and the planner's simulation of it
(loadgen/planning/simulate.py) read them from here, so the simulated admission estimates as the engine does.
"""

from __future__ import annotations

# Exponentially weighted moving averages (EWMA) of the engine's service rates
RESIDENCE_ALPHA = 0.05  # EWMA weight of one finished request's residence
PREFILL_ALPHA = 0.2  # EWMA weight of one window's prefill rate
PREFILL_WINDOW_S = 0.1  # step time a prefill-rate sample spans
STEP_ALPHA = 0.1  # EWMA weight of one step's time
ARRIVAL_ALPHA = 0.05  # EWMA weight of one admitted request's gap and prompt length

# The tail factor: a stochastic approximation of the quantile of TTFT that keeps within the target
TAIL_QUANTILE = 0.99  # the share of accepted requests whose TTFT in the engine should keep within the target
TAIL_STEP = 0.05  # how far one request's outcome moves the tail factor (on a log scale)
TAIL_FACTOR_BOUNDS = (0.5, 20.0)  # the tail factor's range: at most twice as lenient, twenty times as strict
IDLE_FORGET_S = 0.1  # idle this long (nothing running or queued), the engine's next busy period starts at k = 1

# The answers
RETRY_AFTER_MAX_S = 60  # the longest Retry-After of a 429, also when the estimated wait is infinite
QUEUE_BOUND_MARGIN_S = 1.0  # a tier's longest wait (`tier_max_queue_s`): shed this much before it (at most a tenth)
