"""N `tieredkv serve` replicas and SGLang's router over them, as `bench multiturn --replicas`
runs them: the replicas start together (their model loads and warm-ups overlap), the router
once every replica is ready, and `restart(i)` stops one replica and starts it again on the
same port with the same flags (its disk store kept: a warm restart) while the router stays up.
"""

from __future__ import annotations

import time
from pathlib import Path

from tieredkv.bench.managed import ManagedServer
from tieredkv.bench.router import RouterProcess


class ReplicaSet:
    """`replica_args[i]` are replica i's `tieredkv serve` flags; logs go to `log_dir`. Use as a
    context manager: entering starts everything, leaving stops the router, then the replicas."""

    def __init__(
        self, replica_args: list[list[str]], log_dir: Path, policy: str, threads: int | None
    ) -> None:
        self.replica_args = replica_args
        self.log_dir = log_dir
        self.policy = policy
        self.threads = threads
        self.servers: list[ManagedServer] = []
        self.router: RouterProcess | None = None
        self.num_restarts = 0

    @property
    def urls(self) -> list[str]:
        return [server.base_url for server in self.servers]

    @property
    def base_url(self) -> str:
        assert self.router is not None, "the replica set is not started"
        return self.router.base_url

    def start(self) -> ReplicaSet:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        try:
            for index, args in enumerate(self.replica_args):
                log_path = self.log_dir / f"replica{index}.log"
                self.servers.append(ManagedServer(args, log_path, self.threads))
            for server in self.servers:
                server.wait_ready()
            self.router = RouterProcess(self.urls, self.log_dir / "router.log", self.policy)
            self.router.wait_for(set(self.urls))
        except BaseException:
            self.stop()
            raise
        return self

    def restart(self, index: int) -> dict:
        """SIGTERM replica `index`, start it again on its port with its flags, and wait until
        the router holds every replica healthy; the seconds each part took."""
        assert self.router is not None, "the replica set is not started"
        self.num_restarts += 1
        started = time.perf_counter()
        old = self.servers[index]
        old.stop()
        stopped = time.perf_counter()
        log_path = self.log_dir / f"replica{index}-restart{self.num_restarts}.log"
        self.servers[index] = ManagedServer(old.args, log_path, old.threads, port=old.port)
        self.servers[index].wait_ready()
        ready = time.perf_counter()
        self.router.wait_for(set(self.urls))
        done = time.perf_counter()
        return {
            "replica": index,
            "seconds": done - started,
            "stop_s": stopped - started,
            "start_s": ready - stopped,
            "router_s": done - ready,  # until the router's health checks saw it back
            "log": str(log_path),
        }

    def stop(self) -> None:
        if self.router is not None:
            self.router.stop()
        for server in self.servers:
            server.stop()

    def __enter__(self) -> ReplicaSet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
