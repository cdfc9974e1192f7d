"""The engine's design claims, each measured by an experiment on the reference engine (`slobench experiments`):
`registry.EXPERIMENTS`."""
