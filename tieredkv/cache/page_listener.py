"""`PageListener`: what the cache tells a listener when pages land in a local tier or leave it.

The KV events publisher (`tieredkv.kv_events`) implements it; the residency layer calls it
(`residency.page_events`). One call covers one node's run of pages in one tier, keys in page
order; a page's key is the tree's chained page key, so two namespaces never share one. The
remote tier is not reported: its pages belong to the shared store, not to this replica. Calls
come from the engine thread (and from the disk rebuild at start-up, before it runs); a listener
must return at once.
"""

from __future__ import annotations

from typing import Protocol

from tieredkv.cache.tier import Tier


class PageListener(Protocol):
    """Receives page arrivals and departures per tier."""

    def pages_stored(
        self, tier: Tier, keys: tuple[bytes, ...], parent_key: bytes | None, packed: bytes
    ) -> None:
        """Pages with `keys` landed in `tier`; `parent_key` is the page before the first (None
        at a namespace root); `packed` their tokens (int32 little-endian, `token_run`)."""

    def pages_removed(self, tier: Tier, keys: tuple[bytes, ...]) -> None:
        """Pages with `keys` left `tier`."""

    def all_cleared(self) -> None:
        """No page is held in any tier: at start, and after a full flush emptied the cache."""
