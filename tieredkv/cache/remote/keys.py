"""Redis key names of remote pages.

A name is a fixed prefix with the record format version and the hex of the page's stored name:
keyed BLAKE2b of the page key under the deployment secret (`StoreKeys.name`). The page key
chains the model fingerprint, the namespace, its generation and the tokens (see
`index.page_key`), so a name reveals neither tokens nor namespace, cannot be computed without
the secret, and one namespace's names never name another's pages. The version in the prefix
keeps a future format's values apart from this one's.
"""

from __future__ import annotations

from tieredkv.cache.index.page_key import KEY_BYTES
from tieredkv.cache.remote.record import FORMAT_VERSION

KEY_PREFIX = f"tieredkv:kv{FORMAT_VERSION}:"


def redis_key(name: bytes) -> str:
    """The Redis key a page stored under `name` (`StoreKeys.name`) lives at."""
    assert len(name) == KEY_BYTES, f"page name of {len(name)} bytes, want {KEY_BYTES}"
    return KEY_PREFIX + name.hex()
