"""The remote tier's deployment secret at `serve`: required with a remote tier unless waived,
read from the environment or a file only its owner may read, never too short, never shown."""

from __future__ import annotations

from pathlib import Path

import pytest

from tieredkv.cache.remote.secret import SECRET_ENV
from tieredkv.cli_parser import build_parser
from tieredkv.errors import ConfigError
from tieredkv.serve_settings import serve_settings

URL = "redis://127.0.0.1:1/0"
SECRET = "shared-by-the-replicas-5f1e2d3c"


def settings(*flags: str):
    return serve_settings(build_parser().parse_args(["serve", *flags]))


def secret_file(tmp_path: Path, text: str, mode: int = 0o600) -> Path:
    path = tmp_path / "remote-secret"
    path.write_text(text)
    path.chmod(mode)
    return path


def test_a_remote_tier_without_a_secret_is_refused_unless_waived(monkeypatch) -> None:
    monkeypatch.delenv(SECRET_ENV, raising=False)
    with pytest.raises(ConfigError, match="--remote-secret-file") as refused:
        settings("--remote-cache-url", URL)
    assert SECRET_ENV in str(refused.value) and "--remote-insecure-no-secret" in str(refused.value)
    waived = settings("--remote-cache-url", URL, "--remote-insecure-no-secret")
    assert waived.cache.remote_secret is None
    assert settings().cache.remote_secret is None  # no remote tier: no secret asked for


def test_the_secret_comes_from_a_private_file_or_the_environment(monkeypatch, tmp_path) -> None:
    monkeypatch.delenv(SECRET_ENV, raising=False)
    path = secret_file(tmp_path, SECRET + "\n")
    cache = settings("--remote-cache-url", URL, "--remote-secret-file", str(path)).cache
    assert cache.remote_secret == SECRET.encode() and SECRET not in repr(cache)
    monkeypatch.setenv(SECRET_ENV, "from-the-environment-0123")
    cache = settings("--remote-cache-url", URL, "--remote-secret-file", str(path)).cache
    assert cache.remote_secret == b"from-the-environment-0123"


@pytest.mark.parametrize(
    ("text", "mode", "why"),
    [(SECRET, 0o640, "readable by others"), ("short", 0o600, "want at least 16"), ("", 0o600, "")],
)
def test_a_readable_short_or_empty_secret_file_is_refused(
    monkeypatch, tmp_path: Path, text: str, mode: int, why: str
) -> None:
    monkeypatch.delenv(SECRET_ENV, raising=False)
    path = secret_file(tmp_path, text, mode)
    with pytest.raises(ConfigError, match=why or "needs a secret") as refused:
        settings("--remote-cache-url", URL, "--remote-secret-file", str(path))
    assert SECRET not in str(refused.value)
