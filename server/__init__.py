"""The OpenAI-compatible HTTP server (installed as tieredkv.server)."""
