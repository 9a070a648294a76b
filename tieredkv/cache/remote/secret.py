"""The deployment secret of the remote store, and the keys derived from it.

Every replica of a deployment is given the same secret (`$TIEREDKV_REMOTE_SECRET`, or the first
line of a file only its owner may read): never a flag's value, which `ps` shows. Two keys are
derived from it and the model fingerprint's digest (`StoreKeys`):

- the name key: a page's Redis name is keyed BLAKE2b-128 of its page key (which chains the
  namespace, the generation and the tokens, see `index.page_key`), so names cannot be computed,
  nor a prompt's pages located, without the secret;
- the record key: each value carries HMAC-SHA256 over its header and stored payload, so a value
  written without the secret (a forged one, or one of a deployment with another secret) fails
  verification, and the name in its header binds it to the key it was written under.

Without a secret (`--remote-insecure-no-secret`) both keys derive from the empty secret: the
records are still checked for corruption, not for authenticity.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from tieredkv.cache.index.page_key import KEY_BYTES
from tieredkv.errors import ConfigError

SECRET_ENV = "TIEREDKV_REMOTE_SECRET"
MIN_SECRET_BYTES = 16  # a shorter secret is refused: it could be guessed
MAC_BYTES = 32  # HMAC-SHA256


def secret_from_env_or_file(path: str | Path | None = None) -> bytes | None:
    """The secret in `$TIEREDKV_REMOTE_SECRET` if set, else the first line of `path` (which
    must not be group- or world-readable), else None. Shorter than MIN_SECRET_BYTES: refused."""
    secret = os.environ.get(SECRET_ENV)
    where = f"${SECRET_ENV}"
    if not secret and path is not None:
        where = f"remote secret file {str(path)!r}"
        try:
            mode = Path(path).stat().st_mode
            lines = Path(path).read_text(encoding="utf-8").splitlines()
        except OSError as error:
            raise ConfigError(f"{where}: {error.strerror}") from error
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise ConfigError(
                f"{where} is readable by others (mode {stat.S_IMODE(mode):o}); chmod 600 it"
            )
        secret = lines[0] if lines else ""
    if not secret:
        return None
    encoded = secret.encode("utf-8")
    if len(encoded) < MIN_SECRET_BYTES:
        raise ConfigError(
            f"{where}: the secret is {len(encoded)} bytes, want at least {MIN_SECRET_BYTES}"
        )
    return encoded


@dataclass(frozen=True)
class StoreKeys:
    """The keys a deployment's replicas name and seal their remote pages with."""

    name_key: bytes = field(repr=False)  # 32 bytes: keys BLAKE2b over a page key
    record_key: bytes = field(repr=False)  # 32 bytes: keys HMAC-SHA256 over a value

    @classmethod
    def derive(cls, secret: bytes | None, fingerprint_digest: bytes) -> StoreKeys:
        """The keys of `secret` (None: the empty secret) for one model's pages."""
        secret = secret or b""

        def subkey(label: bytes) -> bytes:
            return hmac.digest(secret, label + fingerprint_digest, "sha256")

        return cls(subkey(b"tieredkv-remote-name"), subkey(b"tieredkv-remote-record"))

    def name(self, page_key: bytes) -> bytes:
        """The 16-byte name a page is stored under in the remote store."""
        assert len(page_key) == KEY_BYTES, f"page key of {len(page_key)} bytes, want {KEY_BYTES}"
        return hashlib.blake2b(page_key, digest_size=KEY_BYTES, key=self.name_key).digest()

    def mac(self, fields: bytes | memoryview, payload: bytes | memoryview) -> bytes:
        """HMAC-SHA256 over a value's header fields and its stored payload (the update releases
        the GIL on the payload)."""
        mac = hmac.new(self.record_key, fields, "sha256")
        mac.update(payload)
        return mac.digest()
