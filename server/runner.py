"""Run the app under uvicorn (uvloop, h11) with the contract's graceful SIGTERM.

On SIGTERM (or a first Ctrl+C): the engine starts shutting down at once (it stops accepting,
lets running requests finish for part of its timeout, then aborts the rest, lets transfers in
flight complete and closes the disk store), while uvicorn stops accepting connections and
waits for the open ones, whose streams end as the engine finishes or aborts them. Everything
fits in DRAIN_SECONDS + GRACE_SECONDS, under the contract's 10 s. A second Ctrl+C forces exit.
If the engine could not close its cache in time (stuck I/O), the process exits at once rather
than wait for the stuck threads.

If the engine dies (`/health` says `"engine": "dead"`), the server shuts down the same way and
`serve` returns 1, so a supervisor restarts it.

Before serving, everything alive after start-up (the model's modules, the imports of torch,
transformers and FastAPI, the tokenizer) is moved out of the garbage collector's reach
(`freeze_startup_heap`), as vLLM does for its API server and engine core: a full collection
then walks only what serving allocated, not the start-up heap, and the pause it puts into
whichever thread triggered it (the engine's forward, or the event loop) shrinks with it.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import socket
from types import FrameType
from typing import Protocol

import uvicorn
from fastapi import FastAPI

from tieredkv.config import ServerConfig
from tieredkv.errors import ConfigError

from .connections import guarded_protocol

log = logging.getLogger(__name__)

DRAIN_SECONDS = 6.0  # engine.shutdown(timeout=...): finish, then abort in-flight requests
GRACE_SECONDS = 7.0  # uvicorn's wait for open connections (they close once drained)
FINAL_SECONDS = 2.0  # the rest of the engine shutdown after the connections closed
WATCH_SECONDS = 0.2  # how often the server checks that the engine is alive
DEATH_LINGER_SECONDS = 2.0  # /health answers 503 this long before a dead engine's server exits


class DrainableEngine(Protocol):
    """What the runner needs of the engine (AsyncEngine has it)."""

    async def shutdown(self, timeout: float = ...) -> None: ...

    def health(self) -> dict: ...

    @property
    def closed(self) -> bool: ...


class GracefulServer(uvicorn.Server):
    """uvicorn's server, draining the engine as soon as a shutdown signal arrives."""

    def __init__(self, config: uvicorn.Config, engine: DrainableEngine) -> None:
        super().__init__(config)
        self._engine = engine
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain: asyncio.Task[None] | None = None
        self.engine_died = False

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        watch = asyncio.ensure_future(self._watch_engine())
        # the app's background work once serving (pins made at start: `app.create_app`)
        at_start = [asyncio.ensure_future(start()) for start in self._at_start()]
        try:
            await super().serve(sockets)
        finally:
            watch.cancel()
            for task in at_start:
                task.cancel()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if sockets is not None and self.started:
            # uvicorn says where it listens only for sockets it bound itself; callers (and
            # people) wait for that line
            self._log_started_message(sockets)

    def _at_start(self) -> list:
        state = getattr(self.config.app, "state", None)
        return list(getattr(state, "at_start", []))

    async def _watch_engine(self) -> None:
        while not self.should_exit:
            if self._engine.health().get("engine") == "dead":
                log.critical("the engine died: shutting down, exit status 1")
                self.engine_died = True
                await asyncio.sleep(DEATH_LINGER_SECONDS)  # health checks see the 503
                self.should_exit = True  # uvicorn's own graceful shutdown, as on SIGTERM
                return
            await asyncio.sleep(WATCH_SECONDS)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        # uvicorn re-raises the signal after serving (to die by it); we exit normally instead,
        # once the engine has shut down cleanly.
        captured = getattr(self, "_captured_signals", None)
        if isinstance(captured, list):
            captured.clear()
        if self._loop is not None:
            # a signal handler may not touch the loop directly; this is its thread-safe door
            self._loop.call_soon_threadsafe(self._start_drain)

    def _start_drain(self) -> None:
        if self._drain is None:
            log.info("shutting down: draining the engine (%.0f s at most)", DRAIN_SECONDS)
            self._drain = asyncio.ensure_future(self._engine.shutdown(timeout=DRAIN_SECONDS))

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self._start_drain()
        await super().shutdown(sockets)
        assert self._drain is not None
        try:
            await asyncio.wait_for(asyncio.shield(self._drain), timeout=FINAL_SECONDS)
        except asyncio.TimeoutError:
            log.error("the engine did not shut down in time; exiting anyway")


def uvicorn_config(
    app: FastAPI, server_config: ServerConfig, log_level: str = "info"
) -> uvicorn.Config:
    """uvicorn (uvloop, h11) on --host/--port with the connection limits (`connections`)."""
    return uvicorn.Config(
        app,
        host=server_config.host,
        port=server_config.port,
        loop="uvloop",
        http=guarded_protocol(
            server_config.max_connections,
            server_config.header_timeout_s,
            server_config.stall_timeout_s,
        ),
        lifespan="off",
        log_level=log_level,
        timeout_graceful_shutdown=int(GRACE_SECONDS),
    )


def freeze_startup_heap() -> None:
    """Collect what start-up left behind, then move every object still alive into the
    collector's permanent generation (`gc.freeze`): it is never walked again."""
    gc.collect()
    gc.freeze()
    log.info(
        "start-up heap frozen: %d objects the collector no longer walks", gc.get_freeze_count()
    )


def bind_server_socket(host: str, port: int) -> socket.socket:
    """The server's socket, bound (not yet listening) before the model loads, so that a port
    in use is a one-line error at once rather than after the load; ConfigError names it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
    try:
        sock.bind((host, port))
    except OSError as error:
        sock.close()
        raise ConfigError(
            f"--host {host} --port {port}: cannot listen there ({error.strerror}); "
            "stop whatever uses it or pass another --port"
        ) from None
    return sock


def serve(
    app: FastAPI,
    engine: DrainableEngine,
    server_config: ServerConfig,
    sock: socket.socket | None = None,
) -> int:
    """Serve `app` on `sock` (bound by `bind_server_socket`), else on --host/--port, until
    SIGTERM/SIGINT or the engine's death; returns the exit status (0, or 1 when the engine
    died) after a graceful shutdown."""
    server = GracefulServer(uvicorn_config(app, server_config), engine)
    freeze_startup_heap()
    server.run(sockets=None if sock is None else [sock])
    status = 1 if server.engine_died else 0
    if not engine.closed:  # stuck I/O: its threads would block the interpreter's exit
        log.error("exiting without waiting for the engine's stuck threads")
        logging.shutdown()
        os._exit(status or 1)
    return status
