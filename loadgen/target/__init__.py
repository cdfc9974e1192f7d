"""What slobench points at: model discovery, the embedded reference engine (a subprocess), the mock
server with exact timing, and the ``/metrics`` scraper."""
