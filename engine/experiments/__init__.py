"""The seed's claims as experiments on the reference engine (`slobench experiments`): `registry.EXPERIMENTS`."""
