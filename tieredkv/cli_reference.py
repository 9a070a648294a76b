"""`docs/configuration.md`, generated from `tieredkv serve`'s own parser.

`python -m tieredkv.cli_reference --out docs/configuration.md` (what `make docs` runs) writes it;
a test checks that the committed file equals `render()`, so a flag added, removed or reworded
in `tieredkv.cli_parser` shows up as a stale document until it is generated again.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from tieredkv.bench import BENCHMARKS
from tieredkv.cli_parser import build_parser
from tieredkv.config import CacheConfig
from tieredkv.serve_flags import DEFAULT_DISK_CACHE

INTRO = """\
# Configuration

`tieredkv serve` takes every setting as a command-line flag; nothing is read from a config
file. This page is generated from the parser itself (`make docs`, i.e.
`python -m tieredkv.cli_reference --out docs/configuration.md`), so it lists exactly the flags
the installed `tieredkv serve --help` shows. How to choose the tier sizes is in the
[README](../README.md#sizing-the-tiers); what each tier does is in
[architecture.md](architecture.md) and [operations.md](operations.md).

Four secrets never go on the command line, where `ps` shows them to every user:

- the admin key: `--api-key-file PATH` or `$TIEREDKV_API_KEY` (`--api-key` works, but is
  visible);
- keys bound to tenants: `--api-keys-file PATH` (one `KEY TENANT ROLE` a line, ROLE `admin`
  or `tenant`, `#` comments; the file must not be group- or world-readable);
- the Redis password: `--remote-password-file PATH` or `$TIEREDKV_REDIS_PASSWORD` (a
  `--remote-cache-url` that carries a password is refused);
- the remote tier's secret, the same on every replica, which names and seals the pages in
  Redis: `--remote-secret-file PATH` or `$TIEREDKV_REMOTE_SECRET` (at least 16 bytes; a
  remote tier without one is refused unless `--remote-insecure-no-secret` says so).
"""

SIZE_SYNTAX = """\
## SIZE

A SIZE is an integer with an optional binary unit: `KiB`, `MiB`, `GiB`, `TiB`, or the same
units written `K`, `M`, `G`, `T` (`4G` = `4GiB` = 4,294,967,296 bytes); no unit means bytes.

- `--host-cache-size 0` disables the host tier.
- The disk tier is on when `--disk-cache-dir` is given, with `--disk-cache-size` (default
  16GiB; `0` turns it off). A size without a directory is an error, and so is a size larger
  than the directory's free space less 1 GiB, or a directory whose parent does not exist.
- The device tier must hold one `--max-model-len` sequence; a smaller one is a start-up error.
"""

OTHER_COMMANDS = """\
## Other commands

`tieredkv bench NAME [OPTIONS]` runs one of the built-in benchmarks, each with its own `--help`:
{benchmarks}.
They run against any OpenAI-compatible server or start their own `tieredkv serve` processes;
their committed results are summarised in [benchmarks.md](benchmarks.md).
"""


_INT_TYPES = ("_positive_int", "_port")
# flags whose parser default is None because the config dataclass holds the default
_CONFIG_DEFAULTS = {
    "write_policy": CacheConfig.write_policy.value,
    "namespace_share": "equal",
    "disk_cache_size": f"{DEFAULT_DISK_CACHE}` with `--disk-cache-dir",
}


def _serve_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    for action in parser._actions:  # argparse exposes subcommands only through its actions
        if isinstance(action, argparse._SubParsersAction):
            return action.choices["serve"]
    raise LookupError("the tieredkv parser has no `serve` command")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _flag(action: argparse.Action) -> str:
    flag = " ".join(action.option_strings)
    if action.nargs == 0:
        return f"`{flag}`"
    if action.choices is not None:
        choices = "\\|".join(str(choice) for choice in action.choices)
        return f"`{flag} {choices}`"
    numeric = action.type in (int, float) or getattr(action.type, "__name__", "") in _INT_TYPES
    metavar = action.metavar or ("N" if numeric else action.dest.upper())
    return f"`{flag} {metavar}`"


def _default(action: argparse.Action) -> str:
    if action.nargs == 0:
        return "off"
    if action.dest in _CONFIG_DEFAULTS:  # None on the parser: the config's default applies
        return f"`{_CONFIG_DEFAULTS[action.dest]}`"
    if action.default is None:
        return "—"
    return f"`{action.default}`"


def _table(serve: argparse.ArgumentParser) -> str:
    rows = ["| flag | default | what it does |", "|---|---|---|"]
    for action in serve._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        rows.append(f"| {_flag(action)} | {_default(action)} | {_cell(action.help or '')} |")
    return "\n".join(rows) + "\n"


def render() -> str:
    """The whole of `docs/configuration.md`."""
    parser = build_parser()
    serve = _serve_parser(parser)

    return "\n".join(
        [
            INTRO,
            "## `tieredkv serve` flags\n",
            _table(serve),
            SIZE_SYNTAX,
            OTHER_COMMANDS.format(benchmarks=", ".join(f"`{name}`" for name in BENCHMARKS)),
        ]
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Write `render()` to `--out` (or standard output)."""
    cli = argparse.ArgumentParser(prog="python -m tieredkv.cli_reference", description=__doc__)
    cli.add_argument("--out", type=Path, default=None, help="file to write (default: stdout)")
    args = cli.parse_args(argv)
    text = render()
    if args.out is None:
        sys.stdout.write(text)
    else:
        args.out.write_text(text, encoding="utf-8")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
