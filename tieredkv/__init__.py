"""tieredkv: an LLM inference server with a device / host / disk radix KV cache."""

__version__ = "0.1.0"
