"""Hardening: what a careless operator or an attacker tries against a running or starting
server, and what it gets: a clear refusal, never a traceback or a silent hole. The running
server is the real engine (a tiny random Llama) and app under uvicorn."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch

from tests.model_factory import make_tiny_model_dir
from tests.reliability.live_engine import live_server
from tieredkv.cli import main
from tieredkv.config import ServerConfig
from tieredkv.model.loader import load_model


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model_dir(tmp_path_factory.mktemp("model"))


def _serve_error(capsys: pytest.CaptureFixture[str], model: Path, *flags: str) -> str:
    assert main(["serve", "--model", str(model), "--dtype", "float32", "--port", "0", *flags]) == 1
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


def test_a_symlinked_disk_directory_is_a_one_line_start_up_error(
    capsys: pytest.CaptureFixture[str], tiny_model: Path, tmp_path: Path
) -> None:
    target = tmp_path / "private"
    target.mkdir(mode=0o700)
    (tmp_path / "kv").symlink_to(target)
    err = _serve_error(
        capsys, tiny_model, "--disk-cache-dir", str(tmp_path / "kv"), "--disk-cache-size", "1M"
    )
    assert "is a symlink" in err and str(tmp_path / "kv") in err
    assert list(target.iterdir()) == []


def test_a_disk_directory_under_a_world_writable_parent_is_a_one_line_start_up_error(
    capsys: pytest.CaptureFixture[str], tiny_model: Path, tmp_path: Path
) -> None:
    parent = tmp_path / "shared"
    parent.mkdir()
    os.chmod(parent, 0o777)
    (parent / "kv").mkdir(mode=0o700)
    err = _serve_error(
        capsys, tiny_model, "--disk-cache-dir", str(parent / "kv"), "--disk-cache-size", "1M"
    )
    assert f"under {parent}, which group or others may write" in err
    assert list((parent / "kv").iterdir()) == []


@pytest.fixture(scope="module")
def client(tiny_model: Path) -> Iterator[httpx.Client]:
    model = load_model(tiny_model, dtype=torch.float32)
    with (
        live_server(model, ServerConfig()) as base_url,
        httpx.Client(base_url=base_url, timeout=60) as client,
    ):
        yield client


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),  # each stop is checked on every token
        ({"stop": "x" * 257}, "stop"),  # a stop's length of text is held back while streaming
        ({"stop_token_ids": list(range(65))}, "stop_token_ids"),
        ({"logit_bias": {str(i): 1.0 for i in range(1025)}}, "logit_bias"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"n": 129}, "n"),
    ],
)
def test_per_request_work_is_bounded_or_refused(
    client: httpx.Client, extra: dict, param: str
) -> None:
    for path, body in (
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
        ("/v1/completions", {"prompt": "hi"}),
    ):
        response = client.post(path, json={**body, "max_tokens": 4, **extra})
        assert response.status_code == 400, response.text
        assert response.json()["error"]["param"] == param


def test_stops_within_the_bounds_are_served(client: httpx.Client) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    stops = {"stop": ["x" * 256, "y", "z", "w"], "stop_token_ids": list(range(64))}
    for extra in (stops, {"logit_bias": {}}):
        response = client.post("/v1/chat/completions", json={**body, **extra})
        assert response.status_code == 200, response.text
        choice = response.json()["choices"][0]
        assert choice["finish_reason"] in ("stop", "length")
        assert response.json()["usage"]["completion_tokens"] >= 1  # the engine generated
