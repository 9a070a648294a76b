"""SGLang's real router (`sglang-router`) as a child process, for the tests and benchmarks that
put tieredkv replicas behind it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.integration.server_process import free_port

ROUTER_READY_S = 60.0


def require_router() -> None:
    """Skip when sglang-router (the dev extra) is missing, except on CI."""
    try:
        import sglang_router.sglang_router_rs  # noqa: F401 - the Rust router itself
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail("sglang-router is not installed; CI must install the dev extra")
        pytest.skip("sglang-router not installed (pip install -e '.[dev]')")


class RouterProcess:
    """`python -m sglang_router.launch_router` with `policy` over `worker_urls`; health
    checks every second, so a replica that stops is out of the rotation within about 1 s."""

    def __init__(self, worker_urls: list[str], log_path: Path, policy: str = "cache_aware") -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        command = [
            *(sys.executable, "-m", "sglang_router.launch_router"),
            *("--host", "127.0.0.1", "--port", str(self.port), "--policy", policy),
            *("--worker-urls", *worker_urls),
            *("--health-check-interval-secs", "1", "--health-failure-threshold", "1"),
            *("--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port())),
            *("--log-level", "warn"),
        ]
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT)

    def workers(self) -> list[dict]:
        return httpx.get(self.base_url + "/workers", timeout=5).json()["workers"]

    def wait_for(self, healthy_urls: set[str]) -> list[dict]:
        """The router's worker list once exactly `healthy_urls` are registered and healthy."""
        deadline = time.monotonic() + ROUTER_READY_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"router exited:\n{self.log_path.read_text()[-3000:]}")
            try:
                workers = self.workers()
                if {w["url"] for w in workers if w["is_healthy"]} == healthy_urls:
                    return workers
            except httpx.TransportError:
                pass
            time.sleep(0.2)  # test code: waiting for another process's health checks
        raise RuntimeError(f"router never saw {healthy_urls}:\n{self.log_path.read_text()[-3000:]}")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._log.close()
