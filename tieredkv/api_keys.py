"""API keys from files and the environment, so that no key shows in the process list.

`--api-keys-file`: one key per line, `KEY TENANT ROLE` separated by whitespace, ROLE `admin` or
`tenant`, `#` starts a comment. `--api-key-file`: one key alone. Either file must not be group-
or world-readable. `TIEREDKV_API_KEY` in the environment is the single admin key when neither
`--api-key` nor `--api-key-file` is given.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from tieredkv.config import KeyGrant
from tieredkv.errors import ConfigError

API_KEY_ENV = "TIEREDKV_API_KEY"
ROLES = ("admin", "tenant")
MIN_KEY_CHARS = 16


def read_private_file(path: Path) -> str:
    """The text of a file only its owner can read (ConfigError otherwise, or if unreadable)."""
    try:
        with open(path, encoding="utf-8") as file:
            mode = os.fstat(file.fileno()).st_mode
            if mode & (stat.S_IRWXG | stat.S_IRWXO):
                raise ConfigError(
                    f"{path} is readable or writable by group or others (mode "
                    f"{stat.S_IMODE(mode):o}); run `chmod 600 {path}`"
                )
            return file.read()
    except OSError as error:
        raise ConfigError(f"cannot read {path}: {error.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path} is not UTF-8 text") from None


def read_api_keys_file(path: Path) -> dict[str, KeyGrant]:
    """Every key of an `--api-keys-file` and its grant."""
    grants: dict[str, KeyGrant] = {}
    for number, line in enumerate(read_private_file(path).splitlines(), 1):
        fields = line.split("#", 1)[0].split()
        if not fields:
            continue
        where = f"{path} line {number}"
        if len(fields) != 3:
            raise ConfigError(f"{where}: want `KEY TENANT ROLE`, got {len(fields)} fields")
        key, tenant, role = fields
        if role not in ROLES:
            raise ConfigError(f"{where}: role must be admin or tenant, got {role!r}")
        if len(key) < MIN_KEY_CHARS:
            raise ConfigError(f"{where}: a key needs at least {MIN_KEY_CHARS} characters")
        if key in grants:
            raise ConfigError(f"{where}: the key is listed twice")
        grants[key] = KeyGrant(tenant, admin=role == "admin")
    if not grants:
        raise ConfigError(f"{path} lists no key")
    return grants


def single_api_key(flag: str | None, key_file: Path | None) -> str | None:
    """The admin key: `--api-key`, else `--api-key-file`'s, else $TIEREDKV_API_KEY, else None."""
    if flag is not None and key_file is not None:
        raise ConfigError("give --api-key or --api-key-file, not both")
    if key_file is not None:
        key = read_private_file(key_file).strip()
        if not key or any(c.isspace() for c in key):
            raise ConfigError(f"{key_file} must hold one key, without spaces")
        return key
    if flag is not None:
        return flag
    return os.environ.get(API_KEY_ENV) or None
