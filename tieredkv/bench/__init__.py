"""Benchmarks behind `tieredkv bench NAME ...`: each module has `main(argv) -> int`."""

import importlib

BENCHMARKS = ("multiturn", "tiers", "burst", "forks")


def run(name: str, argv: list[str]) -> int:
    """Run benchmark `name` with its own command-line arguments."""
    module = importlib.import_module(f"tieredkv.bench.{name}")
    return module.main(argv)
