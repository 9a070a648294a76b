"""`tieredkv serve | bench ...`: the command line (docs/configuration.md).

Bad flags end in a one-line error (argparse's usage + message, exit 2); a model or cache that
cannot be loaded or opened ends in `tieredkv serve: error: ...` (exit 1); never a traceback.
Defaults fit a small machine (2 cores, 24 GB RAM); the disk tier is on only when
`--disk-cache-dir` is given (e.g. `--disk-cache-dir ~/.cache/tieredkv/kv`). Errors name the
flags, not the config classes behind them (`serve_flags`).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import socket
import sys
from collections.abc import Sequence
from pathlib import Path

from tieredkv.api_keys import API_KEY_ENV, read_api_keys_file, single_api_key
from tieredkv.bench import BENCHMARKS
from tieredkv.cache.remote.password import password_from_env_or_file
from tieredkv.config import (
    CacheConfig,
    EngineConfig,
    SchedulePolicy,
    ServerConfig,
    WritePolicy,
    parse_size,
)
from tieredkv.errors import ConfigError, TieredKVError
from tieredkv.serve_flags import DEFAULT_DISK_CACHE, disk_tier_flags, in_flag_terms

log = logging.getLogger("tieredkv")

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
    parser = argparse.ArgumentParser(prog="tieredkv", description=__doc__.splitlines()[0])
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
        help="KV pool on the device (GPU memory, or RAM on a CPU-only machine); must hold one "
        "--max-model-len sequence",
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
        help="host bytes each namespace may pin (default: a quarter of the host tier)",
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


@dataclasses.dataclass(frozen=True)
class ServeSettings:
    """Everything `serve` needs besides the model, validated before anything is loaded."""

    model: str | None
    served_model_name: str | None
    max_model_len: int | None
    server: ServerConfig
    cache: CacheConfig
    engine: EngineConfig
    pin_file: Path | None = None


def serve_settings(args: argparse.Namespace) -> ServeSettings:
    """The frozen configs of `serve`'s flags (ConfigError names the flag and the bad value)."""
    try:
        return _serve_settings(args)
    except ConfigError as error:
        raise in_flag_terms(error) from None


def _serve_settings(args: argparse.Namespace) -> ServeSettings:
    disk_dir = args.disk_cache_dir.expanduser() if args.disk_cache_dir else None
    disk_bytes = disk_tier_flags(disk_dir, args.disk_cache_size, parse_size(DEFAULT_DISK_CACHE))
    server = ServerConfig(
        host=args.host,
        port=args.port,
        served_model_name=args.served_model_name,
        api_key=single_api_key(args.api_key, args.api_key_file),
        api_keys=read_api_keys_file(args.api_keys_file) if args.api_keys_file else {},
        max_request_bytes=args.max_request_bytes,
        max_connections=args.max_connections,
        debug_endpoints=args.debug_endpoints,
    )
    cache_fields = (
        {} if args.write_policy is None else {"write_policy": WritePolicy(args.write_policy)}
    )
    cache = CacheConfig(
        page_size=args.page_size,
        device_cache_bytes=args.device_cache_size,
        host_cache_bytes=args.host_cache_size,
        disk_cache_dir=disk_dir,
        disk_cache_bytes=disk_bytes,
        enable_prefix_reuse=not args.no_cache,
        remote_cache_url=args.remote_cache_url,
        remote_compression=args.remote_compression,
        remote_budget_scale=args.remote_budget_scale,
        pin_budget_bytes=args.pin_budget,
        namespace_share=args.namespace_share,
        remote_password=(
            password_from_env_or_file(args.remote_password_file) if args.remote_cache_url else None
        ),
        **cache_fields,
    )
    engine_fields = {} if args.max_model_len is None else {"max_model_len": args.max_model_len}
    engine = EngineConfig(
        max_batch_tokens=args.max_batch_tokens,
        max_num_seqs=args.max_num_seqs,
        max_queue=args.max_queue,
        schedule_policy=SchedulePolicy(args.schedule_policy),
        session_think_time_s=args.session_think_time,
        dtype=args.dtype,
        **engine_fields,
    )
    return ServeSettings(
        args.model, args.served_model_name, args.max_model_len, server, cache, engine, args.pin_file
    )


def run_serve(settings: ServeSettings) -> int:
    """Load the model, start the engine (warm-up, disk index), serve until SIGTERM."""
    from tieredkv.server.runner import bind_server_socket  # heavy imports once flags are good

    # the port first: a port in use is an error now, not after the model has loaded
    sock = bind_server_socket(settings.server.host, settings.server.port)
    try:
        return _load_and_serve(settings, sock)
    finally:
        sock.close()  # uvicorn has closed it after serving; here for a failed start


def _load_and_serve(settings: ServeSettings, sock: socket.socket) -> int:
    """`run_serve` once its socket is bound."""
    import torch

    from tieredkv.engine.async_engine import AsyncEngine
    from tieredkv.engine.metrics import EngineMetrics
    from tieredkv.model.loader import load_model, resolve_dtype
    from tieredkv.server.app import create_app
    from tieredkv.server.runner import serve

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = resolve_dtype(settings.engine.dtype, device)
    print(f"loading {settings.model or 'the default model'} ({dtype}, {device}) ...", flush=True)
    loaded = load_model(settings.model, dtype)
    model_len = loaded.config.max_position_embeddings
    if settings.max_model_len is not None and settings.max_model_len > model_len:
        raise ConfigError(
            f"--max-model-len {settings.max_model_len} exceeds the model's context ({model_len})"
        )
    engine_config = dataclasses.replace(
        settings.engine, max_model_len=settings.max_model_len or model_len
    )
    pins = []
    if settings.pin_file is not None:
        from tieredkv.server.pins import read_pin_file

        pins = read_pin_file(settings.pin_file)
    print("starting the engine (warm-up, disk index) ...", flush=True)
    engine = AsyncEngine.start(
        loaded, settings.cache, engine_config, EngineMetrics(), device=device
    )
    name = settings.served_model_name or loaded.name
    app = create_app(
        engine,
        loaded.tokenizer,
        settings.server,
        name,
        engine.max_model_len,
        clock=engine.clock,
        pins_at_start=pins,
    )
    port = sock.getsockname()[1]
    print(f"serving {name} on http://{settings.server.host}:{port}", flush=True)
    return serve(app, engine, settings.server, sock)


def main(argv: Sequence[str] | None = None) -> int:
    """The `tieredkv` entry point; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "bench":
        from tieredkv import bench

        return bench.run(args.benchmark, args.options)
    try:
        settings = serve_settings(args)
    except ConfigError as exc:
        print(f"tieredkv serve: error: {exc}", file=sys.stderr)
        return 2
    if argv is None:  # the command line, not a caller in this process
        from tieredkv.preload import reexec_with_preload

        reexec_with_preload()
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        status = run_serve(settings)
    except TieredKVError as exc:
        message = in_flag_terms(exc) if isinstance(exc, ConfigError) else exc
        print(f"tieredkv serve: error: {message}", file=sys.stderr)
        status = 1
    except KeyboardInterrupt:  # Ctrl+C while loading, before the server handles signals
        status = 130
    if argv is None:
        quiet_finalization()
    return status


def quiet_finalization() -> None:
    """Everything the server had to say is said: flush it, then send what the interpreter's
    shutdown prints to /dev/null. Native extensions loaded along the way (Triton's, which
    torch's compiler imports even on a CPU) report "leaked instances" there on every exit,
    which reads like a crash and is not one."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stderr.fileno())
    os.close(devnull)
