"""Start a real `tieredkv serve` process on a free loopback port, and stop it with SIGTERM."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

STARTUP_TIMEOUT_SECONDS = 300.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServerProcess:
    """`tieredkv serve ARGS --port P`; or, given `command`, that command (it must serve on
    `port`, e.g. the container's entrypoint) with `env` added to the environment."""

    def __init__(
        self,
        args: list[str],
        log_path: Path,
        command: list[str] | None = None,
        env: dict[str, str] | None = None,
        port: int | None = None,
    ) -> None:
        self.port = port or free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        if command is None:
            command = [
                sys.executable,
                "-c",
                "from tieredkv.cli import main; raise SystemExit(main())",
            ]
            command += ["serve", "--port", str(self.port)]
        command = [*command, *args]
        env = {
            **os.environ,
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2"),
            **(env or {}),
        }
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            command, stdout=self._log, stderr=subprocess.STDOUT, env=env
        )
        self._wait_healthy()

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited at start-up:\n{self.log()}")
            try:
                if httpx.get(self.base_url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)  # test code: waiting for another process to come up
        self.process.kill()
        raise RuntimeError(f"server not healthy after {STARTUP_TIMEOUT_SECONDS} s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-5000:]

    def stop(self, timeout: float = 10.0) -> float:
        """SIGTERM; returns the seconds it took to exit (kills it past `timeout`)."""
        start = time.monotonic()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()
        return time.monotonic() - start
