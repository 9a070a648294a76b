"""One `--no-cache` server for the whole reliability suite: the answers every test compares
against (fp32, greedy)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.reliability.harness import COMMON, Baseline, FaultServer, disk_args


@pytest.fixture(scope="session")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Baseline]:
    log = tmp_path_factory.mktemp("logs") / "baseline.log"
    server = FaultServer([*COMMON, "--no-cache"], log)
    yield Baseline(server)
    server.stop()


API_KEY = "reliability-secret"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
# 128-token sequences on 8 device pages and 4 host pages: three short chats reach the disk.
GUARDED_ARGS = [
    *COMMON,
    *("--max-model-len", "128", "--device-cache-size", "6MiB", "--host-cache-size", "3MiB"),
    *("--api-key", API_KEY, "--max-request-bytes", "64KiB", "--debug-endpoints"),
]


@pytest.fixture(scope="session")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultServer]:
    """A server with --api-key, a 64 KiB request limit and a disk tier, started with umask 0
    and an audit hook that logs every unpickling in the process."""
    root = tmp_path_factory.mktemp("guarded")
    faults = {"umask": 0, "audit_log": str(root / "unpickled.log")}
    args = [*GUARDED_ARGS, *disk_args(root / "kv", "32MiB")]
    server = FaultServer(args, root / "server.log", faults)
    server.root = root
    yield server
    server.stop()
    assert server.process.returncode == 0, server.log()
