"""Secrets never in a Redis URL or a log line: a URL carrying a credential is refused without
repeating it, every logged URL is redacted, and a password Redis refuses is logged once per
reconnection cycle (a real `redis-server --requirepass`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.redis_servers import RedisServer, require_redis
from tests.unit.cache.remote.conftest import FAST_RECONNECT
from tieredkv.cache.remote.connection import check_url, redacted_url
from tieredkv.cache.remote.store import RemoteStore
from tieredkv.cli import main
from tieredkv.errors import ConfigError

SECRET = "pw-0a1b2c3d"
OpenStore = Callable[..., RemoteStore]
CREDENTIAL_URLS = [
    f"redis://:{SECRET}@127.0.0.1:1/0",
    f"redis://default:{SECRET}@127.0.0.1:1/0",
    f"redis://127.0.0.1:1/0?password={SECRET}",
    f"rediss://127.0.0.1:1/0?db=0&ssl_password={SECRET}",
]


@pytest.mark.parametrize("url", CREDENTIAL_URLS)
def test_credentials_in_the_url_are_refused_without_repeating_them(url: str) -> None:
    with pytest.raises(ConfigError) as refused:
        RemoteStore(url, b"f", 16, 1024)
    message = str(refused.value)
    assert SECRET not in message
    assert "TIEREDKV_REDIS_PASSWORD" in message and "--remote-password-file" in message


@pytest.mark.parametrize("url", CREDENTIAL_URLS[1:3])
def test_serve_refuses_them_in_one_line_before_loading_anything(
    url: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    missing_model = tmp_path / "no-model-here"
    assert main(["serve", "--model", str(missing_model), "--remote-cache-url", url]) != 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert "--remote-cache-url must not carry" in err and SECRET not in err


def test_a_bad_scheme_is_refused_with_the_url_redacted() -> None:
    with pytest.raises(ConfigError, match="redis://HOST:PORT/DB") as refused:
        check_url(f"http://user:{SECRET}@127.0.0.1:1/0?token={SECRET}")
    assert SECRET not in str(refused.value) and "user" not in str(refused.value)


def test_redacted_urls_keep_where_and_hide_who() -> None:
    assert redacted_url("redis://127.0.0.1:6380/2") == "redis://127.0.0.1:6380/2"
    hidden = redacted_url(f"redis://admin:{SECRET}@cache.internal:7000/0?password={SECRET}&db=1")
    assert hidden == "redis://cache.internal:7000/0?password=***&db=***"
    assert redacted_url(f"redis://u:{SECRET}@[::1]:7000/0") == "redis://[::1]:7000/0"


def _records(caplog: pytest.LogCaptureFixture, text: str, level: int | None = None) -> list:
    return [
        record
        for record in caplog.records
        if text in record.getMessage() and (level is None or record.levelno == level)
    ]


def _wait_for_retries(caplog: pytest.LogCaptureFixture, count: int) -> None:
    """Until the writer thread has failed `count` more reconnections after the first."""
    deadline = time.monotonic() + 60
    while len(_records(caplog, "failed again")) < count:
        assert time.monotonic() < deadline, "the store stopped retrying"
        time.sleep(0.05)  # test code: the writer thread retries in the background


def _assert_no_secret_logged(caplog: pytest.LogCaptureFixture, *secrets: str) -> None:
    for record in caplog.records:
        line = record.getMessage()
        assert not any(secret in line for secret in secrets), line


def test_a_refused_password_is_logged_once_per_reconnection_cycle(
    tmp_path: Path, open_store: OpenStore, caplog: pytest.LogCaptureFixture
) -> None:
    require_redis()
    caplog.set_level(logging.DEBUG, logger="tieredkv.cache.remote")
    server = RedisServer(tmp_path / "auth", password=SECRET).start()
    try:
        wrong = open_store(server.url, password="wrong-pw-9z8y", timeouts=FAST_RECONNECT)
        assert wrong.degraded
        _wait_for_retries(caplog, 3)
        wrong.close()
        refused = _records(caplog, "refused the password", logging.ERROR)
        assert len(refused) == 1, [record.getMessage() for record in refused]
        assert "--remote-password-file" in refused[0].getMessage()
        caplog.clear()
        none_given = open_store(server.url, timeouts=FAST_RECONNECT)
        _wait_for_retries(caplog, 2)
        none_given.close()
        refused = _records(caplog, "refused the password", logging.ERROR)
        assert len(refused) == 1 and "it needs one" in refused[0].getMessage()
        caplog.clear()
        # a healthy store whose Redis comes back with another password: a new cycle, one line
        right = open_store(server.url, password=SECRET, timeouts=FAST_RECONNECT)
        assert right.healthy
        server.stop()
        server = RedisServer(tmp_path / "auth2", port=server.port, password="rotated-pw-77").start()
        assert right.lookup([b"\0" * 16]) == 0  # the call that finds the connection gone
        _wait_for_retries(caplog, 3)
        assert len(_records(caplog, "refused the password", logging.ERROR)) == 1
    finally:
        server.stop()
    _assert_no_secret_logged(caplog, SECRET, "wrong-pw-9z8y", "rotated-pw-77")


def test_the_connected_line_names_the_server_without_its_user(
    redis_server: RedisServer, open_store: OpenStore, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="tieredkv.cache.remote")
    url = f"redis://default@127.0.0.1:{redis_server.port}/0?health_check_interval=0"
    store = open_store(url)
    assert store.healthy
    connected = _records(caplog, "connected to")
    assert len(connected) == 1
    line = connected[0].getMessage()
    assert f"redis://127.0.0.1:{redis_server.port}/0?health_check_interval=***" in line
    assert "default@" not in line
