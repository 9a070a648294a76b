"""Test-only launcher: `tieredkv serve` whose disk tier runs on a fault-injecting I/O backend.

    python -m tests.reliability.fault_server serve [the usual serve flags]

The faults come from the environment variable TKV_FAULTS, a JSON object (every key optional):

    fail_write: [[errno, after], ...]   the write after `after` more fails with errno
    fail_read:  [[errno, after], ...]   the same for reads
    tear_header: [n, keep_bytes]        the n-th record-header write (1-based) stores only
                                        keep_bytes bytes, then the process is killed (-9)
    tear_payload: [n, keep_bytes]       the same for the n-th payload write
    max_file_bytes: int                 preallocating more fails with ENOSPC (at start)
    write_log: path                     two lines per record-header write, before and after:
                                        "<start|done> <offset> <num_bytes> <zero|data>"
    audit_log: path                     one line per object unpickled in this process
    umask: int                          the process umask (e.g. 0, to check exact file modes)
    hang_payload: n                     the n-th payload write blocks for ever (stuck I/O)
    kill_engine_after_steps: n          engine steps after the n-th raise, and so does failing
                                        their requests: the engine thread dies

Runtime faults are armed once the engine has started (warm-up done, disk index rebuilt), so
their counts are relative to serving. A "crash" is a real SIGKILL of this process, sent from
inside the write that tears: nothing after it runs, exactly as with kill -9. Production code
is untouched: the engine's cache is built with the backend as `build_cache`'s `disk_io`.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from tests.support.fault_io import FaultInjectingIO
from tieredkv.cache.build import build_cache
from tieredkv.cache.disk.direct_io import Buffer, DiskIOBackend, as_bytes
from tieredkv.cache.disk.directory import STORE_FILE
from tieredkv.cache.disk.format import SUPERBLOCK_BYTES, decode_superblock
from tieredkv.cache.tiered_cache import TieredCache
from tieredkv.engine import async_engine
from tieredkv.engine.async_engine import AsyncEngine

# Unpickling any object resolves a global through find_class (marshal is left out: the import
# system uses it for every .pyc).
_UNPICKLE_EVENTS = ("pickle.find_class",)


class KillingIO(FaultInjectingIO):
    """FaultInjectingIO whose crash is a real kill -9, with tears aimed at record headers or
    payloads (told apart by offset once the store's geometry is known)."""

    def __init__(self, spec: dict[str, Any]) -> None:
        super().__init__(max_file_bytes=spec.get("max_file_bytes"))
        self.spec = spec
        self.payload_offset: int | None = None  # None: not armed, nothing logged or torn
        self.counts = {"header": 0, "payload": 0}
        self._count_lock = threading.Lock()
        log = spec.get("write_log")
        self._log_fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND) if log else None

    def arm(self, directory: Path | None) -> None:
        """Read the store's geometry and arm the runtime faults."""
        if directory is not None and (directory / STORE_FILE).exists():
            with open(directory / STORE_FILE, "rb") as file:
                self.payload_offset = decode_superblock(file.read(SUPERBLOCK_BYTES)).payload_offset
        for code, after in self.spec.get("fail_write", []):
            self.fail_write(code, after)
        for code, after in self.spec.get("fail_read", []):
            self.fail_read(code, after)

    def _kind(self, offset: int) -> str | None:
        if self.payload_offset is None or offset < SUPERBLOCK_BYTES:
            return None
        return "header" if offset < self.payload_offset else "payload"

    def pwrite(self, handle: int, offset: int, data: Buffer) -> None:
        kind = self._kind(offset)
        if kind is not None:
            with self._count_lock:
                self.counts[kind] += 1
                count = self.counts[kind]
            if kind == "payload" and self.spec.get("hang_payload") == count:
                threading.Event().wait()  # stuck I/O: this write never returns
            target = self.spec.get(f"tear_{kind}")
            if target is not None and target[0] == count:
                # the torn write itself, then the kill: nothing else of this write lands
                DiskIOBackend.pwrite(self, handle, offset, as_bytes(data)[: target[1]])
                self._crash()
        self._log_header("start", kind, offset, data)
        super().pwrite(handle, offset, data)
        self._log_header("done", kind, offset, data)

    def _log_header(self, event: str, kind: str | None, offset: int, data: Buffer) -> None:
        """A kill can fall between a write and its "done" line: "start" brackets it."""
        if kind == "header" and self._log_fd is not None:
            view = as_bytes(data)
            state = "data" if view.any() else "zero"
            os.write(self._log_fd, f"{event} {offset} {view.nbytes} {state}\n".encode())

    def _crash(self) -> None:
        os.kill(os.getpid(), signal.SIGKILL)
        os._exit(137)  # not reached: SIGKILL to oneself is delivered at once


def _audit_unpickling(path: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)

    def hook(event: str, args: tuple) -> None:
        if event in _UNPICKLE_EVENTS:
            os.write(fd, f"{event} {args!r:.200}\n".encode())

    sys.addaudithook(hook)


def _kill_engine_after(num_steps: int) -> None:
    """Steps after the first `num_steps` (counted once serving) raise, and so does failing
    their requests: the engine thread dies."""
    from tieredkv.engine.engine import Engine

    step = Engine.step
    steps = [0]
    serving = threading.Event()

    def failing_step(self: Engine) -> bool:
        if serving.is_set():
            steps[0] += 1
            if steps[0] > num_steps:
                raise RuntimeError("injected: secret-detail-of-a-step")
        return step(self)

    def failing_fail_all(self: Engine, message: str) -> None:
        raise RuntimeError("injected: secret-detail-of-fail-all")

    Engine.step = failing_step  # type: ignore[method-assign]
    Engine.fail_all = failing_fail_all  # type: ignore[method-assign]
    start = AsyncEngine.start.__func__  # type: ignore[attr-defined]

    def start_then_count(cls: type[AsyncEngine], *args: Any, **kwargs: Any) -> AsyncEngine:
        engine = start(cls, *args, **kwargs)
        serving.set()
        return engine

    AsyncEngine.start = classmethod(start_then_count)  # type: ignore[method-assign]


def _disk_dir(argv: list[str]) -> Path | None:
    return Path(argv[argv.index("--disk-cache-dir") + 1]) if "--disk-cache-dir" in argv else None


def main(argv: list[str]) -> int:
    spec = json.loads(os.environ.get("TKV_FAULTS", "{}"))
    if "umask" in spec:
        os.umask(spec["umask"])
    if "audit_log" in spec:
        _audit_unpickling(spec["audit_log"])
    if "kill_engine_after_steps" in spec:
        _kill_engine_after(spec["kill_engine_after_steps"])
    io = KillingIO(spec)
    start = AsyncEngine.start.__func__  # type: ignore[attr-defined]

    def cache_with_faults(*args: Any, **kwargs: Any) -> TieredCache:
        return build_cache(*args, disk_io=io, **kwargs)

    def start_with_faults(cls: type[AsyncEngine], *args: Any, **kwargs: Any) -> AsyncEngine:
        engine = start(cls, *args, **kwargs)
        io.arm(_disk_dir(argv))
        return engine

    async_engine.build_cache = cache_with_faults  # type: ignore[misc, assignment]
    AsyncEngine.start = classmethod(start_with_faults)  # type: ignore[method-assign]
    from tieredkv.cli import main as cli_main

    return cli_main(argv)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
