"""The `tieredkv` argument parser: `serve`'s flags (the contract, docs/configuration.md), their
value types, the defaults `--help` shows, and `bench NAME`."""

from __future__ import annotations

import argparse
from pathlib import Path

from tieredkv.api_keys import API_KEY_ENV
from tieredkv.bench import BENCHMARKS
from tieredkv.config import (
    EngineConfig,
    SchedulePolicy,
    ServerConfig,
    WritePolicy,
    parse_size,
)
from tieredkv.errors import ConfigError
from tieredkv.serve_flags import DEFAULT_DISK_CACHE

DESCRIPTION = "`tieredkv serve | bench ...`: the command line (docs/configuration.md)."
DEFAULT_DEVICE_CACHE = "2GiB"
DEFAULT_HOST_CACHE = "4GiB"
DEFAULT_MAX_REQUEST_BYTES = "1MiB"


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


def _port(text: str) -> int:
    value = _positive_int(text) if text != "0" else 0
    if value > 65535:
        raise argparse.ArgumentTypeError(f"must be in [0, 65535], got {value}")
    return value


def _namespace_share(text: str) -> float | None:
    """`equal` (None: an equal part among the namespaces holding pages) or a fraction."""
    if text == "equal":
        return None
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected `equal` or a fraction, got {text!r}") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {value}")
    return value


class _DefaultsFormatter(argparse.HelpFormatter):
    """`--help` ends each flag's text with its default, where it has one worth showing."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.default in (None, False, argparse.SUPPRESS) or "default" in text:
            return text
        return f"{text} (default: %(default)s)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tieredkv", description=DESCRIPTION)
    commands = parser.add_subparsers(dest="command", required=True, metavar="{serve,bench}")
    serve = commands.add_parser(
        "serve",
        help="serve a model over an OpenAI-compatible HTTP API",
        formatter_class=_DefaultsFormatter,
    )
    add = serve.add_argument
    add(
        "--model",
        default=None,
        metavar="PATH",
        help="safetensors dir or GGUF file (default: SmolLM2-135M)",
    )
    add(
        "--served-model-name",
        default=None,
        metavar="NAME",
        help="default: the model directory's name",
    )
    add("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    add("--port", type=_port, default=8000, help="TCP port to listen on (0: any free port)")
    add(
        "--dtype",
        choices=("auto", "bfloat16", "float32"),
        default="auto",
        help="weights, activations and KV (auto: bf16 where the hardware is fast at it, else fp32)",
    )
    add(
        "--max-model-len",
        type=_positive_int,
        default=None,
        help="most prompt + max_tokens tokens per request (default: the model's context)",
    )
    add(
        "--page-size",
        type=_positive_int,
        default=16,
        help="tokens per KV page (a power of two): the unit of reuse, eviction, transfer",
    )
    add(
        "--device-cache-size",
        type=_size,
        default=DEFAULT_DEVICE_CACHE,
        metavar="SIZE",
        help="KV on the device (GPU memory, or RAM on a CPU-only machine), the CPU attention's "
        "workspaces included; the pool must hold one --max-model-len sequence",
    )
    add(
        "--workspace-size",
        type=_size,
        default=None,
        metavar="SIZE",
        help="of --device-cache-size, the CPU attention's workspaces (a second copy of the "
        "running sequences' KV; default: what they can need, half the budget or max-num-seqs x "
        "max-model-len tokens if less); more keeps released ones for a chat's next turn",
    )
    add("--host-cache-size", type=_size, default=DEFAULT_HOST_CACHE, metavar="SIZE",
        help="0 disables the host tier")  # fmt: skip
    add("--disk-cache-dir", type=Path, default=None, metavar="DIR",
        help="the disk tier's directory (created if its parent exists)")  # fmt: skip
    add(
        "--disk-cache-size",
        type=_size,
        default=None,
        metavar="SIZE",
        help=f"the disk tier's store file, preallocated (default with --disk-cache-dir: "
        f"{DEFAULT_DISK_CACHE}; 0: no disk tier); at most the free space less 1 GiB",
    )
    add("--remote-cache-url", default=None, metavar="redis://HOST:PORT/DB",
        help="the remote tier: a Redis, or any Redis Cluster node (no password)")  # fmt: skip
    add("--remote-compression", choices=("none", "lz4"), default="none",
        help="codec of remote values (default none: lz4 does not shrink KV pages)")  # fmt: skip
    add("--remote-budget-scale", type=float, default=1.0, metavar="FACTOR",
        help="times the remote lookup and fetch budgets (20 ms; 50 ms + 5 ms/MiB)")  # fmt: skip
    add("--remote-password-file", type=Path, default=None, metavar="PATH",
        help="the Redis password's file (mode 600); or $TIEREDKV_REDIS_PASSWORD")  # fmt: skip
    add("--remote-secret-file", type=Path, default=None, metavar="PATH",
        help="the secret remote pages are named and sealed with (mode 600; the same on every "
        "replica); or $TIEREDKV_REMOTE_SECRET")  # fmt: skip
    add("--remote-insecure-no-secret", action="store_true",
        help="no secret: whoever can write to Redis changes answers")  # fmt: skip
    add("--kv-events-endpoint", default=None, metavar="ENDPOINT",
        help="a ZMQ PUB socket for KV events (vLLM format), e.g. tcp://*:5557")  # fmt: skip
    add("--kv-events-replay-endpoint", default=None, metavar="ENDPOINT",
        help="a ZMQ ROUTER answering a replay of KV events from a sequence number")  # fmt: skip
    add("--kv-events-topic", default="", metavar="TOPIC",
        help="the topic frame of every KV events message")  # fmt: skip
    add(
        "--pin-file",
        type=Path,
        default=None,
        metavar="PATH",
        help="prompts to pin at start: JSON lines of {prompt | messages[, cache_salt]}",
    )
    add(
        "--pin-budget",
        type=_size,
        default=None,
        metavar="SIZE",
        help="host bytes each tenant may pin, all its namespaces (cache_salt values) together; "
        "without API keys, each namespace (default: a quarter of the host tier)",
    )
    add(
        "--pin-budget-total",
        type=_size,
        default=None,
        metavar="SIZE",
        help="host bytes all pins together may hold (default: half the host tier, or "
        "--pin-budget when larger)",
    )
    add(
        "--retention-budget",
        type=_size,
        default=None,
        metavar="SIZE",
        help='bytes of prompts sent with prompt_cache_retention "24h" held on the lowest local '
        "tier, shared equally among namespaces (default: a quarter of disk, else of host; 0: off)",
    )
    add(
        "--namespace-share",
        type=_namespace_share,
        default=None,
        metavar="FRACTION",
        help="each namespace's share of the device and host tiers: above it, its pages leave "
        "first (default `equal`: an equal part among the namespaces holding pages; 1: plain LRU)",
    )
    add(
        "--host-whole-pages",
        action="store_true",
        help="models with sliding-window layers: every host page keeps all its layers (by "
        "default a page keeps its sliding layers only within the window a next turn reads, so "
        "the host holds more history of conversations several windows long)",
    )
    add(
        "--device-whole-pages",
        action="store_true",
        help="models with sliding-window layers: every device page keeps all its layers (by "
        "default a page's sliding layers are freed once neither a running sequence's window "
        "nor a next turn's reads them, so the device holds more long history)",
    )
    add(
        "--disk-whole-pages",
        action="store_true",
        help="models with sliding-window layers: every disk record holds a whole page (by "
        "default a page's layers are records of their own and its sliding layers are written "
        "only within the window a next turn reads, so the disk holds more long history)",
    )
    add(
        "--session-think-time",
        type=float,
        default=EngineConfig.session_think_time_s,
        metavar="SECONDS",
        help="a conversation named by X-Session-ID or `user` keeps its pages on host this long "
        "after each turn (0: off)",
    )
    add(
        "--write-policy",
        choices=[p.value for p in WritePolicy],
        default=None,
        help="write_through (default): copy new pages down in the background, so eviction is "
        "free; write_back: copy a page down only when it is evicted",
    )
    add(
        "--schedule-policy",
        choices=[p.value for p in SchedulePolicy],
        default="lpm",
        help="lpm: longest cached prefix first (by tier, with aging); fcfs: arrival order",
    )
    add(
        "--max-batch-tokens",
        type=_positive_int,
        default=EngineConfig.max_batch_tokens,
        help="tokens forwarded per step: decodes plus prefill chunks",
    )
    add(
        "--max-num-seqs",
        type=_positive_int,
        default=EngineConfig.max_num_seqs,
        help="sequences running or promoting at once",
    )
    add(
        "--max-queue",
        type=_positive_int,
        default=EngineConfig.max_queue,
        help="requests waiting to run; one more is answered 429",
    )
    add(
        "--max-request-bytes",
        type=_size,
        default=DEFAULT_MAX_REQUEST_BYTES,
        metavar="SIZE",
        help="largest request body; a larger one is answered 413",
    )
    add(
        "--max-request-tokens",
        type=_positive_int,
        default=ServerConfig.max_request_tokens,
        help="tokens one request may generate over all its sequences, max(n, best_of) x "
        "max_tokens; beyond it 400 (an omitted max_tokens is cut to fit)",
    )
    add("--max-connections", type=_positive_int, default=ServerConfig.max_connections,
        help="open connections; one more is answered 503 and closed")  # fmt: skip
    add("--api-key", default=None, metavar="KEY",
        help=f"an admin Bearer token (better: --api-key-file or ${API_KEY_ENV})")  # fmt: skip
    add("--api-key-file", type=Path, default=None, metavar="PATH",
        help="a file holding the admin key (mode 600)")  # fmt: skip
    add("--api-keys-file", type=Path, default=None, metavar="PATH",
        help="keys bound to tenants: `KEY TENANT ROLE` per line, ROLE admin|tenant")  # fmt: skip
    add("--no-cache", action="store_true", help="no prefix reuse at all (recompute baseline)")
    add("--debug-endpoints", action="store_true", help="serve GET /debug/cache")
    bench = commands.add_parser("bench", help=f"benchmarks ({', '.join(BENCHMARKS)})")
    bench.add_argument("benchmark", choices=BENCHMARKS)
    bench.add_argument("options", nargs=argparse.REMAINDER)
    return parser
