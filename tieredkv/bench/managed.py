"""`tieredkv serve` as a child process on a free loopback port, for the benchmark's own runs.

The child's output is copied to a log file by a reader thread, which also notices when uvicorn
is listening (then /health must answer 200). Stopped with SIGTERM.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import httpx

from tieredkv.errors import TieredKVError

STARTUP_TIMEOUT_S = 600.0  # first use converts the default model; a cold 2-core box is slow
STOP_TIMEOUT_S = 15.0
_LISTENING = "Uvicorn running on"


class ServerStartError(TieredKVError):
    """A benchmark's own `tieredkv serve` did not come up."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ManagedServer:
    """A running `tieredkv serve ARGS` on `port` (a free one when not given; a restarted
    replica keeps its own); use as a context manager."""

    def __init__(
        self, args: list[str], log_path: Path, threads: int | None = None, port: int | None = None
    ) -> None:
        self.args = list(args)
        self.threads = threads
        self.port = port if port is not None else free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self._listening = threading.Event()  # set on uvicorn's line, or when output ends
        self._listening_seen = False
        command = [sys.executable, "-c", "from tieredkv.cli import main; raise SystemExit(main())"]
        command += ["serve", "--port", str(self.port), *self.args]
        env = dict(os.environ)
        if threads is not None:
            env["OMP_NUM_THREADS"] = str(threads)
        self.process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env
        )
        self._reader = threading.Thread(target=self._read_output, daemon=True)
        self._reader.start()

    def _read_output(self) -> None:
        assert self.process.stdout is not None
        with open(self.log_path, "wb") as log:
            for line in self.process.stdout:
                log.write(line)
                log.flush()
                if _LISTENING in line.decode(errors="replace"):
                    self._listening_seen = True
                    self._listening.set()
        self._listening.set()  # the process ended: wake the waiter, who checks poll()

    def wait_ready(self, timeout_s: float = STARTUP_TIMEOUT_S) -> None:
        """Block until the server listens and /health is 200; else stop it and raise."""
        # SYNC: the reader thread sets the event when uvicorn listens or the child exits
        listening = self._listening.wait(timeout_s) and self._listening_seen
        if not listening or self.process.poll() is not None:
            self.stop()
            raise ServerStartError(f"tieredkv serve did not start:\n{self.log_tail()}")
        try:
            response = httpx.get(self.base_url + "/health", timeout=30)
        except httpx.HTTPError as exc:
            self.stop()
            raise ServerStartError(f"/health failed: {exc}\n{self.log_tail()}") from None
        if response.status_code != 200:
            self.stop()
            raise ServerStartError(f"/health is {response.status_code}: {response.text[:300]}")

    def log_tail(self, num_chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-num_chars:]
        except OSError:
            return "(no log)"

    def stop(self) -> int | None:
        """SIGTERM, then kill past STOP_TIMEOUT_S; the exit status."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._reader.join(timeout=5)
        return self.process.returncode

    def __enter__(self) -> ManagedServer:
        self.wait_ready()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
