"""`tieredkv serve | bench ...`: the command line (docs/configuration.md).

Bad flags end in a one-line error (argparse's usage + message, exit 2); a model or cache that
cannot be loaded or opened ends in `tieredkv serve: error: ...` (exit 1); never a traceback.
Defaults fit a small machine (2 cores, 24 GB RAM); the disk tier is on only when
`--disk-cache-dir` is given (e.g. `--disk-cache-dir ~/.cache/tieredkv/kv`). The flags are
parsed by `cli_parser`, turned into configs by `serve_settings`; errors name the flags, not the
config classes behind them (`serve_flags`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from tieredkv.cli_parser import build_parser
from tieredkv.errors import ConfigError, TieredKVError
from tieredkv.serve_flags import in_flag_terms
from tieredkv.serve_settings import ServeSettings, serve_settings

if TYPE_CHECKING:
    from tieredkv.kv_events.publisher import KvEventPublisher


def run_serve(settings: ServeSettings) -> int:
    """Load the model, start the engine (warm-up, disk index), serve until SIGTERM."""
    from tieredkv.server.runner import bind_server_socket  # heavy imports once flags are good

    # the port first: a port in use is an error now, not after the model has loaded
    sock = bind_server_socket(settings.server.host, settings.server.port)
    publisher = None
    try:
        if settings.kv_events is not None:  # its sockets too: an endpoint in use fails now
            from tieredkv.kv_events.publisher import KvEventPublisher

            publisher = KvEventPublisher(settings.kv_events, settings.cache.page_size)
        return _load_and_serve(settings, sock, publisher)
    finally:
        sock.close()  # uvicorn has closed it after serving; here for a failed start
        if publisher is not None:
            publisher.close()  # after the engine closed the cache: its last events go out


def _load_and_serve(
    settings: ServeSettings, sock: socket.socket, publisher: KvEventPublisher | None
) -> int:
    """`run_serve` once its socket (and the KV events publisher's, if any) is bound."""
    import torch

    from tieredkv.engine.async_engine import AsyncEngine
    from tieredkv.engine.metrics import EngineMetrics
    from tieredkv.model.loader import load_model, resolve_dtype
    from tieredkv.preload import release_free_memory
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
    metrics = EngineMetrics()
    if publisher is not None:
        publisher.count_into(metrics.kv_events_published, metrics.kv_events_dropped)
    engine = AsyncEngine.start(
        loaded, settings.cache, engine_config, metrics, device=device, page_listener=publisher
    )
    loaded.weights.clear()  # the model holds each weight once, laid out for its products
    release_free_memory()
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
