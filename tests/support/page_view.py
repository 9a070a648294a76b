"""`PageView`: a `PageListener` that keeps, per tier, the page keys the cache said it holds, so
a test can compare what a consumer of the events would believe with what the tree holds."""

from __future__ import annotations

from tieredkv.cache.index.page_key import chain_packed_keys
from tieredkv.cache.index.token_run import TOKEN_BYTES
from tieredkv.cache.tier import Tier
from tieredkv.cache.tiered_cache import TieredCache


class PageView:
    """Applies each call as a consumer would, refusing what no consumer could make sense of."""

    def __init__(self) -> None:
        self.tiers: dict[Tier, set[bytes]] = {tier: set() for tier in Tier}

    def pages_stored(
        self, tier: Tier, keys: tuple[bytes, ...], parent_key: bytes | None, packed: bytes
    ) -> None:
        held = self.tiers[tier]
        assert tier is not Tier.REMOTE, "the remote tier is not reported"
        assert not held & set(keys), f"pages stored twice in {tier.label}"
        if parent_key is not None:  # the tokens chain from the parent to exactly these keys
            assert parent_key in set().union(*self.tiers.values()), "a parent never stored"
            page_size = len(packed) // (TOKEN_BYTES * len(keys))
            assert chain_packed_keys(parent_key, packed, page_size) == list(keys)
        held.update(keys)

    def pages_removed(self, tier: Tier, keys: tuple[bytes, ...]) -> None:
        held = self.tiers[tier]
        assert set(keys) <= held, f"pages removed from {tier.label} that were not stored"
        held.difference_update(keys)

    def all_cleared(self) -> None:
        assert not any(self.tiers.values()), "cleared after the removals: nothing is left"

    def matches(self, cache: TieredCache) -> bool:
        """Does the view hold exactly the keys of every local copy in the tree?"""
        actual: dict[Tier, set[bytes]] = {tier: set() for tier in Tier}
        for node in cache.tree.iter_nodes():
            for tier in node.residence.copies:
                if tier is not Tier.REMOTE:
                    actual[tier].update(cache.tree.page_keys(node))
        return actual == self.tiers
