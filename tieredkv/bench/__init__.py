"""Benchmarks behind `tieredkv bench NAME ...`: each module has `main(argv) -> int`.

Research tools (bursts, forks, tenants, replicas behind a router, plots) are scripts under
`benchmarks/` that import from here."""

import importlib

BENCHMARKS = ("multiturn", "tiers")


def run(name: str, argv: list[str]) -> int:
    """Run benchmark `name` with its own command-line arguments."""
    module = importlib.import_module(f"tieredkv.bench.{name}")
    return module.main(argv)
