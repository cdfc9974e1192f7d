"""The HTTP front end: the OpenAI routes, request and response shapes, Prometheus metrics, the step loop on a thread
or in an engine-core process of its own, launching (``python -m engine.server``)."""
