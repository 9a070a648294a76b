"""Lazy re-prioritisation in TierHeap pops in the order eager pushes on every use gave."""

import random

from tieredkv.cache.index.radix_node import RadixNode
from tieredkv.cache.residency.eviction import LruEvictionPolicy, TierHeap
from tieredkv.cache.residency.residence import Residence
from tieredkv.cache.tier import Tier


def _nodes(count: int) -> list[RadixNode]:
    root = RadixNode(None, b"", 0, [], b"root", Residence.for_root)
    nodes = []
    for i in range(count):
        node = RadixNode(root, bytes(4), 1, [bytes([i])], b"root", root.residence.child)
        node.residence.set_copy(Tier.DEVICE, [i])
        if i % 3 == 0:
            node.residence.set_copy(Tier.HOST, [i])  # a device copy with a host copy below it
        nodes.append(node)
    return nodes


def _always(node: RadixNode, tier: Tier) -> bool:
    return True


class CountingHeap(TierHeap):
    """Counts pushes (pushes made inside `pop` are lazy re-prioritisations)."""

    pushes = 0

    def push(self, node: RadixNode, priority: tuple[int, int]) -> None:
        self.pushes += 1
        super().push(node, priority)


def test_lazy_heap_pops_in_the_eager_heap_order() -> None:
    rng = random.Random(5)
    policy = LruEvictionPolicy()
    for _ in range(30):
        eager_nodes, lazy_nodes = _nodes(24), _nodes(24)
        eager, lazy = TierHeap(Tier.DEVICE), CountingHeap(Tier.DEVICE)
        clock = 0
        for e, lz in zip(eager_nodes, lazy_nodes, strict=True):
            clock += 1
            e.last_access = lz.last_access = clock
            eager.push(e, policy.priority(e, Tier.DEVICE))
            lazy.push(lz, policy.priority(lz, Tier.DEVICE))
        eager_order, lazy_order, live = [], [], list(range(24))
        reprioritised = 0
        while live:
            if rng.random() < 0.7:  # a use: eager pushes again, lazy only stamps the node
                for index in rng.sample(live, rng.randint(1, min(4, len(live)))):
                    clock += 1
                    eager_nodes[index].last_access = lazy_nodes[index].last_access = clock
                    eager.push(eager_nodes[index], policy.priority(eager_nodes[index], Tier.DEVICE))
                continue
            popped_eager, pushes_before = eager.pop(_always), lazy.pushes
            popped_lazy = lazy.pop(_always)
            assert popped_eager is not None and popped_lazy is not None
            reprioritised += lazy.pushes - pushes_before
            eager_order.append(eager_nodes.index(popped_eager))
            lazy_order.append(lazy_nodes.index(popped_lazy))
            live.remove(eager_order[-1])
        assert lazy_order == eager_order
        assert lazy.pop(_always) is None
    assert reprioritised  # the lazy path was exercised


def test_a_used_node_is_repushed_not_returned() -> None:
    first, second = _nodes(2)  # the first has a host copy, the second not yet
    heap = TierHeap(Tier.HOST)
    policy = LruEvictionPolicy()
    first.last_access, second.last_access = 1, 2
    heap.push(first, policy.priority(first, Tier.HOST))
    second.residence.set_copy(Tier.HOST, [8])
    heap.push(second, policy.priority(second, Tier.HOST))
    first.last_access = 3  # used after both were pushed
    assert heap.pop(_always) is second
    assert heap.pop(_always) is first
    assert heap.pop(_always) is None
