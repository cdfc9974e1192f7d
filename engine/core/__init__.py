"""The engine: ``Engine.step()`` (schedule, run, process), the requests it takes or refuses (intake, SLO admission),
the outputs after the model, its stats."""
