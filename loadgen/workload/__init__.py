"""What to send: request specs, synthetic workloads, arrival processes, production-trace readers and
the one post-processing step (length scaling, tie spreading) every trace builder calls."""
