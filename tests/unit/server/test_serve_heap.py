"""`serve` freezes the start-up heap before it serves: the garbage collector's full
collections then walk only what serving allocated (see `server/runner.py`)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
from tieredkv.server import runner

from tests.unit.server.conftest import make_app
from tests.unit.server.fake_engine import FakeEngine
from tieredkv.config import ServerConfig


@pytest.fixture
def unfrozen_after() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()  # the rest of this test process walks its heap as before


def test_the_start_up_heap_is_frozen_before_serving(
    engine: FakeEngine, monkeypatch: pytest.MonkeyPatch, unfrozen_after: None
) -> None:
    start_up_object = [["built before serving"]]  # tracked (lists are), alive before `serve`
    frozen_at_run: list[int] = []
    walked_at_run: list[bool] = []

    def run(self: runner.GracefulServer, sockets: object = None) -> None:
        frozen_at_run.append(gc.get_freeze_count())
        walked_at_run.append(any(o is start_up_object for o in gc.get_objects()))

    monkeypatch.setattr(runner.GracefulServer, "run", run)
    assert gc.get_freeze_count() == 0
    assert runner.serve(make_app(engine), engine, ServerConfig(port=0)) == 0
    assert frozen_at_run and frozen_at_run[0] > 1000  # the interpreter, torch, FastAPI, ...
    assert walked_at_run == [False]  # a collection no longer walks what start-up left
