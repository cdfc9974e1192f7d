"""slobench's Locust driver (``locust -f loadgen/drivers/locust/locustfile.py`` or ``slobench run --driver locust``).

Importing this package does not import Locust (which monkey-patches the standard library with gevent):
only ``locustfile``, ``users`` and ``shape`` do, and they run inside a ``locust`` process.
``driver`` starts such a process for slobench's own commands.
"""
