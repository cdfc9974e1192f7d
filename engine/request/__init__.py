"""What a request is and what comes back: the engine's configuration, sampling parameters, sequences, outputs and
timings. Plain data, no torch: the layer every other part of the engine imports."""
