"""The engine: ``Engine.step()`` (schedule, run, process), the requests it takes or refuses (intake and
admission), the outputs after the model, its stats.
"""
