"""Benchmarks behind `tieredkv bench NAME ...`: each module has `main(argv) -> int`."""

import argparse
import importlib

BENCHMARKS = ("multiturn", "tiers", "burst", "forks")


def run(name: str, argv: list[str]) -> int:
    """Run benchmark `name` with its own command-line arguments."""
    module = importlib.import_module(f"tieredkv.bench.{name}")
    return module.main(argv)


def fill_preset(args: argparse.Namespace, presets: dict[str, dict]) -> None:
    """Flags left unset take the `quick` preset's value with `--quick`, else the default's."""
    for key, value in presets["quick" if args.quick else "default"].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
