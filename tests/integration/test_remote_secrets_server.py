"""A real `tieredkv serve` (a tiny random Llama) on a real `redis-server --requirepass` given
the wrong password: it serves, retries in the background, and its log says so once for the
whole reconnection cycle, with no password in any line (Redis's own ACL LOG counts the
attempts)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.integration.server_process import ServerProcess
from tests.model_factory import make_tiny_model_dir
from tests.redis_servers import RedisServer, require_redis
from tieredkv.cache.remote.password import PASSWORD_ENV

SECRET = "redis-pw-5e6f7a8b"
WRONG = "not-it-1c2d3e4f"


def auth_failures(redis: RedisServer) -> int:
    """Failed AUTHs Redis has logged (similar entries are counted in one)."""
    with redis.client() as client:
        return sum(int(entry["count"]) for entry in client.acl_log() if entry["reason"] == "auth")


def test_a_refused_password_is_logged_once_while_the_server_retries(tmp_path: Path) -> None:
    require_redis()
    redis = RedisServer(tmp_path / "redis", password=SECRET).start()
    model = make_tiny_model_dir(tmp_path / "model")
    args = ["--model", str(model), "--dtype", "float32", "--device-cache-size", "1MiB"]
    args += ["--host-cache-size", "1MiB", *redis.serve_flags()]
    server = None
    try:
        server = ServerProcess(args, tmp_path / "serve.log", env={PASSWORD_ENV: WRONG})
        deadline = time.monotonic() + 120
        while auth_failures(redis) < 4:
            assert time.monotonic() < deadline, "the server stopped retrying"
            time.sleep(0.2)  # test code: the server reconnects in the background
        server.stop()
        log = server.log_path.read_text()
        refused = [line for line in log.splitlines() if "refused the password" in line]
        assert len(refused) == 1, refused
        assert "ERROR" in refused[0] and "--remote-password-file" in refused[0]
        assert SECRET not in log and WRONG not in log
    finally:
        if server is not None:
            server.stop()
        redis.stop()


@pytest.mark.parametrize("where", ["user info", "query"])
def test_a_url_with_credentials_never_reaches_the_log(tmp_path: Path, where: str) -> None:
    url = (
        f"redis://:{SECRET}@127.0.0.1:1/0"
        if where == "user info"
        else (f"redis://127.0.0.1:1/0?password={SECRET}")
    )
    model = make_tiny_model_dir(tmp_path / "model")
    with pytest.raises(RuntimeError, match="server exited at start-up") as refused:
        ServerProcess(["--model", str(model), "--remote-cache-url", url], tmp_path / "serve.log")
    assert "--remote-cache-url must not carry" in str(refused.value)
    assert SECRET not in (tmp_path / "serve.log").read_text()
