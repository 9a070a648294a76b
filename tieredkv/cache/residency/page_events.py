"""`PageEvents`: a node's copy arriving in a tier or leaving it, told to the cache's
`PageListener` as the pages' keys (the first time a page needs its key, `RadixTree.page_keys`),
its parent page's key and its tokens; the remote tier is not reported (`page_listener`)."""

from __future__ import annotations

from tieredkv.cache.index.radix_node import RadixNode
from tieredkv.cache.index.radix_tree import RadixTree
from tieredkv.cache.page_listener import PageListener
from tieredkv.cache.tier import Tier


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
