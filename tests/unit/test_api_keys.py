"""API keys from files and the environment: the keys file's format and privacy, the single
admin key from a flag, a file or $TIEREDKV_API_KEY."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tieredkv.api_keys import API_KEY_ENV, read_api_keys_file, single_api_key
from tieredkv.config import KeyGrant
from tieredkv.errors import ConfigError

KEY = "k" * 20


def private(path: Path, text: str) -> Path:
    path.write_text(text)
    os.chmod(path, 0o600)
    return path


def test_the_keys_file_maps_keys_to_grants(tmp_path: Path) -> None:
    text = f"# comment\n\n{KEY}a  acme tenant # trailing\n{KEY}b ops\tadmin\n"
    grants = read_api_keys_file(private(tmp_path / "keys", text))
    assert grants == {f"{KEY}a": KeyGrant("acme", False), f"{KEY}b": KeyGrant("ops", True)}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (f"{KEY} acme\n", "want `KEY TENANT ROLE`"),
        (f"{KEY} acme owner\n", "role must be admin or tenant"),
        ("short acme tenant\n", "at least 16 characters"),
        (f"{KEY} a tenant\n{KEY} b tenant\n", "line 2: the key is listed twice"),
        ("# nothing\n", "lists no key"),
    ],
)
def test_a_bad_keys_file_names_the_line(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        read_api_keys_file(private(tmp_path / "keys", text))


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o660])
def test_a_readable_keys_file_is_refused(tmp_path: Path, mode: int) -> None:
    path = private(tmp_path / "keys", f"{KEY} acme tenant\n")
    os.chmod(path, mode)
    with pytest.raises(ConfigError, match="chmod 600"):
        read_api_keys_file(path)


def test_the_single_key_from_a_flag_a_file_or_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    assert single_api_key(None, None) is None
    assert single_api_key("flag-key", None) == "flag-key"
    assert single_api_key(None, private(tmp_path / "key", f"{KEY}\n")) == KEY
    monkeypatch.setenv(API_KEY_ENV, "env-key")
    assert single_api_key(None, None) == "env-key"
    assert single_api_key("flag-key", None) == "flag-key"  # the flag wins
    with pytest.raises(ConfigError, match="not both"):
        single_api_key("flag-key", tmp_path / "key")
    with pytest.raises(ConfigError, match="one key"):
        single_api_key(None, private(tmp_path / "two", "a b\n"))
