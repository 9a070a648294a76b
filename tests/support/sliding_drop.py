"""Marking a copy without some pages' sliding part, for tests of the gaps and the match cut: the
per-node rule (every node end a reuse point), simpler than the tree's (`tree_kept_sliding`)
and applied to any tier's copy, whole-page pools included."""

from __future__ import annotations

import numpy as np

from tieredkv.cache.index.radix_node import RadixNode
from tieredkv.cache.residency.residency import Residency
from tieredkv.cache.sliding_pages import kept_sliding_pages
from tieredkv.cache.tier import Tier


def node_kept_sliding(num_tokens: int, window: int, page_size: int) -> np.ndarray:
    """(num_pages,) bool: whether each page of a radix node of `num_tokens` tokens keeps its
    sliding part when every node end is a reuse point. The reuse points at or after a page of
    the node are its end and its descendants' ends; a later end's window reaches no further back
    than the node end's, so the node's own end decides."""
    return kept_sliding_pages(num_tokens // page_size, [num_tokens], window, page_size)


def drop_sliding_parts(residency: Residency, node: RadixNode, tier: Tier) -> frozenset[int]:
    """Mark `node`'s copy in `tier` without the sliding part of the pages `node_kept_sliding`
    does not keep; returns the copy's gaps. Matches served from it are cut where a window
    reads one of them."""
    record = node.residence
    window = residency.sliding_window
    assert tier in record.copies and window is not None, f"{node}: no {tier} copy to drop"
    kept = node_kept_sliding(node.num_tokens, window, residency.tree.page_size)
    gaps = record.sliding_gaps.get(tier, frozenset())
    gaps = gaps.union(index for index, keep in enumerate(kept.tolist()) if not keep)
    record.set_gaps(tier, gaps)
    return gaps
