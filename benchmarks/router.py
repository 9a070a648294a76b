"""SGLang's real router (PyPI `sglang-router`, a dev dependency) as a child process over tieredkv
replicas, launched as its docs show (`python -m sglang_router.launch_router`), with health
checks every second so a replica that stops is out of the rotation within about one second.
The router tells which workers it holds healthy only through `GET /workers`, so waiting for it
polls that."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx

from tieredkv.bench.managed import free_port
from tieredkv.errors import TieredKVError

ROUTER_READY_S = 60.0
STOP_TIMEOUT_S = 10.0
POLL_S = 0.2  # between two reads of the router's worker list
# the router's own policies that route by themselves (`manual` needs routing keys)
ROUTER_POLICIES = ("cache_aware", "round_robin", "power_of_two", "random")


class RouterMissingError(TieredKVError):
    """sglang-router is not installed."""


class RouterStartError(TieredKVError):
    """The router exited, or never saw the workers it was waited for."""


def require_router() -> None:
    """RouterMissingError (saying how to install it) unless sglang-router is importable."""
    try:
        import sglang_router.sglang_router_rs  # noqa: F401 - the Rust router itself
    except ImportError:
        raise RouterMissingError(
            "sglang-router is not installed (pip install sglang-router, or tieredkv's dev "
            "extra: pip install -e '.[dev]')"
        ) from None


class RouterProcess:
    """The router with `policy` over `worker_urls`, on a free loopback port; logs to
    `log_path`. Its Prometheus exporter gets a free port of its own."""

    def __init__(self, worker_urls: list[str], log_path: Path, policy: str = "cache_aware") -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.policy = policy
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

    def wait_for(self, healthy_urls: set[str], timeout_s: float = ROUTER_READY_S) -> list[dict]:
        """The router's worker list once exactly `healthy_urls` are registered and healthy."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RouterStartError(f"the router exited:\n{self.log_tail()}")
            try:
                workers = self.workers()
                if {w["url"] for w in workers if w["is_healthy"]} == healthy_urls:
                    return workers
            except httpx.TransportError:
                pass  # not listening yet
            time.sleep(POLL_S)  # the router's health checks run in another process
        wanted = sorted(healthy_urls)
        raise RouterStartError(f"the router never saw {wanted} healthy:\n{self.log_tail()}")

    def log_tail(self, num_chars: int = 3000) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")[-num_chars:]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()
