"""Fixtures for server tests: a tiny real tokenizer (ChatML template), the fake engine, the app
under Starlette's TestClient, and the app served by uvicorn on an ephemeral port."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import uvicorn
from fastapi import FastAPI
from fastapi.testclient import TestClient
from tieredkv.server.app import create_app
from tieredkv.server.runner import uvicorn_config

from tests.model_factory import CHATML_TEMPLATE, build_tiny_tokenizer
from tests.unit.server.fake_engine import FakeEngine
from tieredkv.config import ServerConfig
from tieredkv.model.tokenizer import ChatTokenizer

MODEL_NAME = "tiny-chat"
MAX_MODEL_LEN = 256


@pytest.fixture(scope="session")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> ChatTokenizer:
    return tiny_chat_tokenizer(tmp_path_factory.mktemp("tokenizer"))


def tiny_chat_tokenizer(model_dir: Path) -> ChatTokenizer:
    """The tiny tokenizer with a ChatML template, saved under `model_dir`."""
    build_tiny_tokenizer().save(str(model_dir / "tokenizer.json"))
    config = {
        "bos_token": "<|im_start|>",
        "eos_token": "<|im_end|>",
        "chat_template": CHATML_TEMPLATE,
    }
    (model_dir / "tokenizer_config.json").write_text(json.dumps(config))
    return ChatTokenizer(Path(model_dir))


@pytest.fixture
def engine(tokenizer: ChatTokenizer) -> FakeEngine:
    return FakeEngine(tokenizer)


def make_app(engine: FakeEngine, **server_options: object) -> FastAPI:
    config = ServerConfig(**server_options)  # type: ignore[arg-type]
    return create_app(engine, engine.tokenizer, config, MODEL_NAME, MAX_MODEL_LEN)


@pytest.fixture
def app(engine: FakeEngine) -> FastAPI:
    return make_app(engine, max_request_bytes=64 << 10)


@pytest.fixture
def client(app: FastAPI) -> Iterator[TestClient]:
    """Raises any server-side exception in the test; at the end, no request may have reached
    the catch-all 500 handler."""
    with TestClient(app) as test_client:
        yield test_client
    assert app.state.internal_errors == 0


@contextmanager
def serve(app: FastAPI, config: ServerConfig | None = None) -> Iterator[str]:
    """`app` under uvicorn configured as `tieredkv serve` configures it (uvloop, h11, the
    connection limits of `config`) on 127.0.0.1 with an ephemeral port; its base URL. The
    engine is whichever `app` was built on: the fake here, the real one in
    `tests/reliability/live_engine.py`."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn_config(app, config or ServerConfig(), log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        while not server.started:  # start-up wait, not a timed assertion
            assert thread.is_alive(), "uvicorn failed to start"
            time.sleep(0.01)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join()
        sock.close()
