"""``slobench capacity``: the pure search, the settings and each step's requests, one measured step, its
early-stop policy and statistics, and the whole run with its summary."""
