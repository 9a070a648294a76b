"""One `--no-cache` server for the whole reliability suite: the answers every test compares
against (fp32, greedy)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.reliability.harness import COMMON, Baseline, FaultServer


@pytest.fixture(scope="session")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Baseline]:
    log = tmp_path_factory.mktemp("logs") / "baseline.log"
    server = FaultServer([*COMMON, "--no-cache"], log)
    yield Baseline(server)
    server.stop()
