"""Redis's `maxmemory-policy`, read when a connection opens, and what it means for the pages.

Ordinary pages carry no expiry; a retained prompt's pages carry one, 24 h from their latest
retention (`writer`). Under memory pressure (`maxmemory` reached), by policy:

| policy                                       | what Redis evicts                              |
|----------------------------------------------|------------------------------------------------|
| allkeys-lru, allkeys-lfu, allkeys-random     | any page, retained ones too: the expiry bounds |
|                                              | a retained page, it does not protect it        |
| volatile-lru, volatile-lfu, volatile-random, | only pages with an expiry: the retained ones,  |
| volatile-ttl                                 | and only them; with none left, writes fail     |
| noeviction                                   | nothing: writes fail until pages expire        |

allkeys-lru is the recommended policy (docs/operations.md); volatile-*, noeviction and
allkeys-random are logged as a warning at each connection when Redis has a `maxmemory` (without
one it evicts nothing and only grows). A server that refuses CONFIG GET (a managed Redis may
rename it) is not checked.
"""

from __future__ import annotations

import logging
from typing import Any

from tieredkv.cache.remote.connection import connection_errors

log = logging.getLogger(__name__)

WARNINGS = {
    "volatile": "evicts only the pages with an expiry, the retained prompts' ones, and refuses "
    "writes once none is left",
    "noeviction": "evicts nothing: once Redis is full every write is refused",
    "allkeys-random": "evicts pages at random, recently used ones as readily as old ones",
}


def read_memory_settings(client: Any) -> tuple[int, str] | None:
    """The server's `maxmemory` (bytes; 0: no limit) and `maxmemory-policy` (a cluster: the
    node the client asks), or None when they cannot be read."""
    try:
        reply = client.config_get("maxmemory*")
    except connection_errors() as error:
        log.debug("remote store: maxmemory-policy unreadable: %s", error)
        return None
    if "maxmemory-policy" not in reply:  # a cluster client's reply: one dict per node
        reply = next((value for value in reply.values() if isinstance(value, dict)), {})
    if "maxmemory" not in reply or "maxmemory-policy" not in reply:
        return None
    return int(reply["maxmemory"]), str(reply["maxmemory-policy"])


def check_memory_policy(client: Any) -> str | None:
    """Read the policy; warn when Redis has a memory limit and a policy that does not suit a
    cache of pages (see the module table)."""
    settings = read_memory_settings(client)
    if settings is None:
        return None
    maxmemory, policy = settings
    if maxmemory == 0:
        log.info("remote store: Redis has no maxmemory: nothing is evicted, it only grows")
        return policy
    why = WARNINGS["volatile"] if policy.startswith("volatile") else WARNINGS.get(policy)
    if why is not None:
        log.warning(
            "remote store: maxmemory-policy %s %s; use allkeys-lru (docs/operations.md)",
            policy,
            why,
        )
    return policy
