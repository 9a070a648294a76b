"""Warm restart: index the disk store's records again so their prefixes match in the disk tier.

A record written without its page's sliding part (`PageRecord.sliding_held`) makes that page a
gap of the rebuilt disk copy, so a match through it is cut as before the restart.

Records chain by parent key: a record whose parent key is no record's key hangs from that key
as a namespace root (the namespace string is never stored; `match` recomputes the root key from
(fingerprint, namespace), so a restarted server finds the same chain again). Duplicate keys and
records no root reaches are freed. Single-child chains are merged back into runs.

A chain whose parent page was lost is indistinguishable from one under a namespace root (both
hang from a key no record has): it is kept, unmatched, with the oldest access time, so it is the
first thing the disk tier drops. The keys chains hang from are remembered
(`Residency.rebuilt_roots`): a live path that computes the lost page again would otherwise
write a second record of the pages after it, and report them stored twice (`Demoter`).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from tieredkv.cache.index.page_key import token_bytes
from tieredkv.cache.tier import Tier

if TYPE_CHECKING:
    from tieredkv.cache.disk.split_store import SplitDiskStore
    from tieredkv.cache.disk.store import DiskStore
    from tieredkv.cache.index.radix_node import RadixNode
    from tieredkv.cache.index.radix_tree import RadixTree
    from tieredkv.cache.page_record import PageRecord
    from tieredkv.cache.residency.residency import Residency

logger = logging.getLogger(__name__)


def rebuild_from_disk(
    tree: RadixTree, disk: DiskStore | SplitDiskStore, residency: Residency
) -> int:
    """Attach every reachable record of `disk.scan()` to `tree`; returns the pages indexed."""
    by_key: dict[bytes, tuple[int, PageRecord]] = {}
    unusable: list[int] = []
    for slot, record in disk.scan():
        if record.key in by_key or len(record.tokens) != tree.page_size:
            unusable.append(slot)  # a duplicate (or a page of another size): freed
        else:
            by_key[record.key] = (slot, record)
    children: dict[bytes, list[tuple[int, PageRecord]]] = {}
    for slot, record in by_key.values():
        children.setdefault(record.parent_key, []).append((slot, record))
    stack: list[tuple[RadixNode, bytes]] = []
    for parent_key in children:
        if parent_key not in by_key:
            root = tree.root(parent_key, create=True)
            assert root is not None
            stack.append((root, parent_key))
            residency.rebuilt_roots.add(parent_key)
    attached: list[RadixNode] = []
    while stack:
        parent, parent_key = stack.pop()
        for slot, record in children.pop(parent_key, []):
            node = tree.attach(parent, token_bytes(record.tokens), [record.key])
            gaps = frozenset() if record.sliding_held else frozenset({0})
            residency.found_copy(node, Tier.DISK, [slot], gaps)
            attached.append(node)
            stack.append((node, record.key))
    unreached = [slot for group in children.values() for slot, _ in group]  # key cycles
    if unusable or unreached:
        disk.free(unusable + unreached)
    for node in attached:  # parents before children
        while node.attached and tree.can_merge(node):
            node = tree.merge(node)
    for node in attached:
        residency.refresh(node)
    logger.info(
        "warm restart: %d disk pages indexed, %d duplicates and %d unreachable freed",
        len(attached),
        len(unusable),
        len(unreached),
    )
    return len(attached)
