"""Where the Redis password comes from: the environment or a file, never the command line
(a command line is visible to every user of the machine through `ps`)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from tieredkv.errors import ConfigError

PASSWORD_ENV = "TIEREDKV_REDIS_PASSWORD"


def password_from_env_or_file(path: str | Path | None = None) -> str | None:
    """The password in `$TIEREDKV_REDIS_PASSWORD` if set, else the first line of `path` (which
    must not be group- or world-readable), else None (no AUTH)."""
    from_env = os.environ.get(PASSWORD_ENV)
    if from_env:
        return from_env
    if path is None:
        return None
    path = Path(path)
    try:
        mode = path.stat().st_mode
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise ConfigError(f"redis password file {str(path)!r}: {error.strerror}") from error
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(
            f"redis password file {str(path)!r} is readable by others (mode "
            f"{stat.S_IMODE(mode):o}); chmod 600 it"
        )
    lines = text.splitlines()
    if not lines or not lines[0]:
        raise ConfigError(f"redis password file {str(path)!r} is empty")
    return lines[0]
