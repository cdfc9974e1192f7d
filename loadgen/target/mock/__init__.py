"""A mock OpenAI-compatible streaming target with exact timing (``slobench mock-server``)."""
