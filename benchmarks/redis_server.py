"""A real `redis-server` as a child process on a loopback port, for the benchmarks that give
replicas a remote tier: its own directory, no persistence (`--save ""`, no AOF), so every start
is an empty store. Its output is copied to `redis.log` in that directory by a reader thread,
which also notices Redis's "Ready to accept connections" line (the start waits on it, not on
a poll). The tests' Redis helpers build on this class."""

from __future__ import annotations

import secrets
import shutil
import signal
import subprocess
import threading
from pathlib import Path

from tieredkv.bench.managed import free_port
from tieredkv.errors import TieredKVError

READY_S = 10.0  # a local Redis that is not ready by then will not be
STOP_TIMEOUT_S = 10.0
_READY = b"Ready to accept connections"


class RedisMissingError(TieredKVError):
    """`redis-server` is not on PATH."""


class RedisStartError(TieredKVError):
    """A benchmark's own `redis-server` did not come up."""


def require_redis_server() -> str:
    """The path of `redis-server`; RedisMissingError says how to install it."""
    path = shutil.which("redis-server")
    if path is None:
        raise RedisMissingError(
            "redis-server is not on PATH (the remote tier's benchmark starts its own: "
            "apt-get install redis-server, or brew install redis)"
        )
    return path


class RedisServer:
    """One `redis-server` on 127.0.0.1:`port` (free when not given) with `extra_args`; stop it,
    kill it and start it again on the same port."""

    def __init__(
        self, directory: Path, port: int | None = None, extra_args: tuple[str, ...] = ()
    ) -> None:
        self.directory = directory
        self.port = port if port is not None else free_port()
        self.extra_args = tuple(extra_args)
        self.process: subprocess.Popen[bytes] | None = None
        self._ready = threading.Event()  # set on the ready line, or when output ends
        self._ready_seen = False
        self._reader: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def serve_flags(self) -> list[str]:
        """`tieredkv serve`'s flags for a remote tier on this Redis: its URL and the replicas'
        shared secret, in a file (mode 600) written in this server's directory once."""
        path = self.directory / "remote-secret"
        if not path.exists():
            self.directory.mkdir(parents=True, exist_ok=True)
            path.touch(mode=0o600)
            path.write_text(secrets.token_hex(32) + "\n")
        return ["--remote-cache-url", self.url, "--remote-secret-file", str(path)]

    @property
    def log_path(self) -> Path:
        return self.directory / "redis.log"

    def command(self) -> list[str]:
        args = [require_redis_server(), "--port", str(self.port), "--bind", "127.0.0.1"]
        args += ["--dir", str(self.directory), "--save", "", "--appendonly", "no"]
        return [*args, *self.extra_args]  # no --logfile: the log goes to stdout, to the reader

    def start(self) -> RedisServer:
        """Start it and wait until it accepts connections; RedisStartError if it does not."""
        self.directory.mkdir(parents=True, exist_ok=True)
        self._ready.clear()
        self._ready_seen = False
        self.process = subprocess.Popen(
            self.command(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        self._reader = threading.Thread(target=self._read_output, daemon=True)
        self._reader.start()
        # SYNC: the reader thread sets the event on the ready line or when the child exits
        if not self._ready.wait(READY_S) or not self._ready_seen:
            self.stop()
            tail = self.log_tail()
            raise RedisStartError(f"redis-server on port {self.port} did not start:\n{tail}")
        return self

    def _read_output(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        with open(self.log_path, "ab") as log:
            for line in self.process.stdout:
                log.write(line)
                log.flush()
                if _READY in line:
                    self._ready_seen = True
                    self._ready.set()
        self._ready.set()  # the process ended: wake the waiter

    def log_tail(self, num_chars: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-num_chars:]
        except OSError:
            return "(no log)"

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL: the server vanishes, as in a crash."""
        if self.running():
            assert self.process is not None
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()
        self._join_reader()

    def stop(self) -> None:
        """SIGTERM, then SIGKILL past STOP_TIMEOUT_S."""
        if self.running():
            assert self.process is not None
            self.process.terminate()
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.kill()
        self._join_reader()

    def _join_reader(self) -> None:
        if self._reader is not None:
            self._reader.join(timeout=5)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
