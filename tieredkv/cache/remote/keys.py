"""Redis key names of remote pages.

A name is a fixed prefix with the record format version and the page key's hex. The page key
is BLAKE2b over the model fingerprint, the namespace and the tokens (see `index.page_key`), so
a name reveals neither tokens nor namespace, and one namespace's names never name another's
pages. The version in the prefix keeps a future format's values apart from this one's.
"""

from __future__ import annotations

from tieredkv.cache.index.page_key import KEY_BYTES
from tieredkv.cache.remote.record import FORMAT_VERSION

KEY_PREFIX = f"tieredkv:kv{FORMAT_VERSION}:"


def redis_key(page_key: bytes) -> str:
    """The Redis key a page is stored under."""
    assert len(page_key) == KEY_BYTES, f"page key of {len(page_key)} bytes, want {KEY_BYTES}"
    return KEY_PREFIX + page_key.hex()
