"""Load generators behind one small protocol (``drivers.base.Driver``): the in-process aiohttp
replayer, the sharded multi-process replayer and Locust, with the SSE parsing and stream recording
they share."""
