"""N `tieredkv serve` replicas and SGLang's router over them, as benchmarks/replicas.py
runs them: the replicas start together (their model loads and warm-ups overlap), the router
once every replica is ready, and `begin_restart(i)` stops one replica (once the router routes
around it, the run goes on without it) and starts it again in the background on the same port
with the same flags (its disk store kept: a warm restart) while the router stays up;
`finish_restart()` waits until the router holds it healthy again.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from benchmarks.router import RouterProcess
from tieredkv.bench.managed import ManagedServer


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
        self._restart: tuple | None = None  # (thread, times, started, failure) while under way

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

    def begin_restart(self, index: int) -> None:
        """SIGTERM replica `index` and wait until the router no longer counts it healthy; then
        start it again in the background (`finish_restart` waits for it)."""
        assert self.router is not None, "the replica set is not started"
        assert self._restart is None, "one restart at a time"
        self.num_restarts += 1
        started = time.perf_counter()
        old = self.servers[index]
        old.stop()
        stopped = time.perf_counter()
        self.router.wait_for(set(self.urls) - {old.base_url})
        routed_around = time.perf_counter()
        log_path = self.log_dir / f"replica{index}-restart{self.num_restarts}.log"
        times = {"replica": index, "stop_s": stopped - started,
                 "router_out_s": routed_around - stopped, "log": str(log_path)}  # fmt: skip
        failure: list[BaseException] = []

        def start_again() -> None:
            try:
                server = ManagedServer(old.args, log_path, old.threads, port=old.port)
                self.servers[index] = server
                server.wait_ready()
                times["start_s"] = time.perf_counter() - routed_around
            except BaseException as error:  # raised again by finish_restart
                failure.append(error)

        thread = threading.Thread(target=start_again, name=f"restart-replica{index}")
        thread.start()
        self._restart = (thread, times, started, failure)

    def finish_restart(self) -> dict | None:
        """Wait for the restart begun, if any: its replica ready and the router holding every
        replica healthy. The seconds each part took (None: no restart was under way)."""
        if self._restart is None:
            return None
        assert self.router is not None
        thread, times, started, failure = self._restart
        self._restart = None
        thread.join()  # SYNC: the bench waits for its own child server to come up
        if failure:
            raise failure[0]
        ready = time.perf_counter()
        self.router.wait_for(set(self.urls))
        done = time.perf_counter()
        # away: from SIGTERM until the router held it healthy again (it served nothing then)
        return {**times, "router_in_s": done - ready, "seconds": done - started}

    def stop(self) -> None:
        if self._restart is not None:
            self._restart[0].join()
        if self.router is not None:
            self.router.stop()
        for server in self.servers:
            server.stop()

    def __enter__(self) -> ReplicaSet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
