"""Hardening (issue #14): what a careless operator or an attacker tries against a running or
starting server, and what it gets: a clear refusal, never a traceback or a silent hole."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from tieredkv.server.app import create_app

from tests.model_factory import make_tiny_model_dir
from tests.unit.server.conftest import MODEL_NAME, tiny_chat_tokenizer
from tests.unit.server.fake_engine import FakeEngine
from tieredkv.cli import main
from tieredkv.config import ServerConfig


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model_dir(tmp_path_factory.mktemp("model"))


def _serve_error(capsys: pytest.CaptureFixture[str], model: Path, *flags: str) -> str:
    assert main(["serve", "--model", str(model), "--dtype", "float32", *flags]) == 1
    err = capsys.readouterr().err
    assert err.startswith("tieredkv serve: error:") and "Traceback" not in err
    assert err.count("\n") == 1, err  # one line
    return err


def test_a_world_writable_disk_directory_is_a_one_line_start_up_error(
    capsys: pytest.CaptureFixture[str], tiny_model: Path, tmp_path: Path
) -> None:
    directory = tmp_path / "kv"
    directory.mkdir()
    os.chmod(directory, 0o777)
    err = _serve_error(
        capsys, tiny_model, "--disk-cache-dir", str(directory), "--disk-cache-size", "1M"
    )
    assert "group- or world-writable" in err and str(directory) in err


def test_a_symlinked_store_file_is_a_one_line_start_up_error(
    capsys: pytest.CaptureFixture[str], tiny_model: Path, tmp_path: Path
) -> None:
    directory = tmp_path / "kv"
    directory.mkdir(mode=0o700)
    (directory / "pages-0.tkv").symlink_to(tmp_path / "elsewhere")
    err = _serve_error(
        capsys, tiny_model, "--disk-cache-dir", str(directory), "--disk-cache-size", "1M"
    )
    assert "pages-0.tkv" in err
    assert not (tmp_path / "elsewhere").exists()


@pytest.fixture(scope="module")
def fake_client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    engine = FakeEngine(tiny_chat_tokenizer(tmp_path_factory.mktemp("tokenizer")))
    app = create_app(engine, engine.tokenizer, ServerConfig(), MODEL_NAME, 256)
    with TestClient(app) as client:
        yield client


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),  # 190k stops once slowed every stream
        ({"stop": "x" * 257}, "stop"),  # a long stop held back all streamed text
        ({"stop_token_ids": list(range(65))}, "stop_token_ids"),
        ({"logit_bias": {str(i): 1.0 for i in range(1025)}}, "logit_bias"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"n": 129}, "n"),
    ],
)
def test_per_request_work_is_bounded_or_refused(
    fake_client: TestClient, extra: dict, param: str
) -> None:
    for path, body in (
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
        ("/v1/completions", {"prompt": "hi"}),
    ):
        response = fake_client.post(path, json={**body, "max_tokens": 4, **extra})
        assert response.status_code == 400, response.text
        assert response.json()["error"]["param"] == param


def test_stops_within_the_bounds_are_served(fake_client: TestClient) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    stops = {"stop": ["x" * 256, "y", "z", "w"], "stop_token_ids": list(range(64))}
    assert fake_client.post("/v1/chat/completions", json={**body, **stops}).status_code == 200
    assert (
        fake_client.post("/v1/chat/completions", json={**body, "logit_bias": {}}).status_code == 200
    )
