"""What a run leaves behind and what it means: records, the latency definitions, SLO statistics, the
summary, run metadata and the run folder (docs/ARCHITECTURE.md, "Contracts"). Imports nothing else
from loadgen."""
