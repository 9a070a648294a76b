"""What the cache tells a listener when a node's pages land in a tier or leave it.

`PageListener` is the contract (the KV events publisher, `tieredkv.kv_events`, implements it);
`PageEvents` turns the residency layer's copy changes into its calls. One call covers one node's
run of pages in one tier, keys in page order; a page's key is the tree's chained page key, so
two namespaces never share one. The remote tier is not reported: its pages belong to the shared
store, not to this replica. Calls come from the engine thread (and from the disk rebuild at
start-up, before it runs); a listener must return at once.
"""

from __future__ import annotations

from typing import Protocol

from tieredkv.cache.index.radix_node import RadixNode
from tieredkv.cache.index.radix_tree import RadixTree
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
        """Every page left every tier (a full flush that emptied the cache)."""


class PageEvents:
    """Reports one node's copy arriving in or leaving a tier to a `PageListener`."""

    def __init__(self, tree: RadixTree, listener: PageListener) -> None:
        self.tree = tree
        self.listener = listener

    def stored(self, node: RadixNode, tier: Tier) -> None:
        if tier is Tier.REMOTE:
            return
        tree = self.tree
        parent = node.parent
        assert parent is not None, "a namespace root holds no pages"
        parent_key = None if parent.parent is None else tree.page_keys(parent)[-1]
        keys = tuple(tree.page_keys(node))
        self.listener.pages_stored(tier, keys, parent_key, node.packed)

    def removed(self, node: RadixNode, tier: Tier) -> None:
        if tier is not Tier.REMOTE:
            self.listener.pages_removed(tier, tuple(self.tree.page_keys(node)))

    def cleared(self) -> None:
        self.listener.all_cleared()
