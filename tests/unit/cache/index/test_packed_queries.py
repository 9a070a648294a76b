"""`match` and `insert` give the same results for ids and for `PackedTokens`.

Two caches run the same random requests (matches, prefill-chunk inserts from the locked node,
evictions to host and back), one given lists of ids, the other the same tokens packed; every
result, and the trees, must be identical.
"""

import random

import pytest

from tests.support.tiny_cache import make_cache, tiny_layout
from tieredkv.cache.index.match_results import InsertResult, MatchResult
from tieredkv.cache.index.radix_node import RadixNode
from tieredkv.cache.index.token_run import PackedTokens
from tieredkv.cache.tier import Tier
from tieredkv.cache.tiered_cache import TieredCache

PS = 4
LAYOUT = tiny_layout(PS)


def _path(node: RadixNode | None) -> tuple[bytes, ...]:
    return () if node is None else tuple(n.packed for n in node.path())


def _match_view(match: MatchResult) -> tuple[object, ...]:
    segments = tuple((s.tier, s.pages, tuple(_path(n) for n in s.nodes)) for s in match.segments)
    return (match.num_tokens, match.matched_len, segments, _path(match.last_node))


def _insert_view(result: InsertResult) -> tuple[object, ...]:
    return (
        result.num_existing_pages,
        result.num_pages,
        _path(result.node),
        result.device_pages,
        result.duplicate_pages,
    )


def _tree_view(cache: TieredCache) -> list[tuple[object, ...]]:
    return sorted(
        (_path(node), node.keys, sorted(node.residence.copies.items()), node.last_access)
        for node in cache.tree.iter_nodes()
    )


class _Client:
    """One cache, fed ids or packed tokens."""

    def __init__(self, packed: bool) -> None:
        self.cache, self.executor = make_cache(LAYOUT, device_pages=40, host_pages=60)
        self.packed = packed

    def query(self, ids: list[int]) -> list[int] | PackedTokens:
        return PackedTokens.from_ids(ids) if self.packed else ids

    def request(self, ids: list[int], namespace: str, rng: random.Random) -> list[object]:
        """Match twice, lock, compute the rest in chunks, insert at each chunk end; finish."""
        cache, seen = self.cache, []
        cache.match(self.query(ids), namespace)
        match = cache.match(self.query(ids), namespace)
        seen.append(_match_view(match))
        locked = match.device.nodes[-1] if match.device.num_pages else None
        if locked is not None:
            cache.lock(locked)
        table = list(match.device.pages)
        pages = cache.allocate(-(-len(ids) // PS) - len(table))
        if pages is not None:
            table += pages
            tree_pages, kv_len = len(match.device.pages), match.device.num_pages * PS
            while kv_len < len(ids):
                kv_len = min(kv_len + rng.randint(1, 20), len(ids))
                full = kv_len // PS
                if full <= tree_pages:
                    continue
                start = locked if tree_pages else None
                result = cache.insert(
                    self.query(ids[: full * PS]),
                    namespace,
                    table[:full],
                    start_node=start,
                    start_pages=tree_pages if start is not None else 0,
                )
                seen.append(_insert_view(result))
                if result.node is not None and result.node is not locked:
                    cache.lock(result.node)
                    if locked is not None:
                        cache.unlock(locked)
                    locked = result.node
                table[: result.num_pages] = result.device_pages
                tree_pages = result.num_pages
                if result.duplicate_pages:
                    cache.free(result.duplicate_pages)
            cache.free(table[tree_pages:])
        if locked is not None:
            cache.unlock(locked)
        return seen

    def settle(self) -> None:
        while self.executor.pending():
            self.executor.complete_all()
            self.cache.poll()


@pytest.mark.parametrize("seed", range(4))
def test_ids_and_packed_tokens_give_the_same_results(seed: int) -> None:
    rng_ids, rng_a, rng_b = (
        random.Random(seed),
        random.Random(seed + 100),
        random.Random(seed + 100),
    )
    clients = _Client(packed=False), _Client(packed=True)
    bases = [[rng_ids.randint(0, 3) for _ in range(48)] for _ in range(3)]
    host_hits = 0
    for _ in range(40):
        base = rng_ids.choice(bases)
        ids = base[: rng_ids.randint(1, 48)] + [rng_ids.randint(0, 3) for _ in range(3)]
        namespace = rng_ids.choice(["a", "b"])
        seen_ids = clients[0].request(ids, namespace, rng_a)
        seen_packed = clients[1].request(ids, namespace, rng_b)
        assert seen_ids == seen_packed
        host_hits += any(s[2][1][1] for s in seen_ids[:1])  # a host segment was matched
        if rng_ids.random() < 0.3:
            num_pages = rng_ids.randint(1, 12)
            for client in clients:
                client.cache.evict(Tier.DEVICE, num_pages)
                client.settle()
        assert _tree_view(clients[0].cache) == _tree_view(clients[1].cache)
        for client in clients:
            assert client.cache.check_integrity().ok
    assert host_hits > 0  # matches crossed tiers, not only the device
