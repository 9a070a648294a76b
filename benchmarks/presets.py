"""Command-line helpers shared by the benchmark scripts that start their own servers
(burst, forks, tenants): presets for flags left unset, and the servers' common options."""

import argparse
from pathlib import Path


def fill_preset(args: argparse.Namespace, presets: dict[str, dict]) -> None:
    """Flags left unset take the `quick` preset's value with `--quick`, else the default's."""
    for key, value in presets["quick" if args.quick else "default"].items():
        if getattr(args, key) is None:
            setattr(args, key, value)


def add_server_options(parser: argparse.ArgumentParser, dtype: str) -> None:
    """The options of a benchmark that starts its own servers: dtype (default `dtype`),
    context, device tier, threads, output folder and `--quick`."""
    add = parser.add_argument
    add("--dtype", default=dtype)
    add("--max-model-len", type=int)
    add("--device-cache-size", dest="device_cache")
    add("--threads", type=int, help="OMP_NUM_THREADS of the servers")
    add("--out", type=Path)
    add("--quick", action="store_true", help="tiny sizes for tests; figures meaningless")


def parse_with_preset(
    parser: argparse.ArgumentParser, argv: list[str], presets: dict[str, dict]
) -> argparse.Namespace:
    """Parse `argv`, then fill the flags left unset from the preset (`fill_preset`)."""
    args = parser.parse_args(argv)
    fill_preset(args, presets)
    return args
