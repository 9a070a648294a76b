"""`TieredCache.insert(..., start_node=, start_pages=)` gives what the walk from the root gives."""

import random

import pytest

from tests.support.tiny_cache import make_cache, tiny_layout
from tieredkv.cache.index.match_results import InsertResult
from tieredkv.cache.index.radix_node import RadixNode
from tieredkv.cache.tiered_cache import TieredCache

PS = 4
LAYOUT = tiny_layout(PS)


def _shape(node: RadixNode | None) -> tuple[bytes, ...]:
    return () if node is None else tuple(n.packed for n in node.path())


def _comparable(result: InsertResult) -> tuple[object, ...]:
    return (
        result.num_existing_pages,
        result.num_pages,
        _shape(result.node),
        result.device_pages,
        result.duplicate_pages,
    )


class _Request:
    """A request the way the engine's RequestPages drives the cache."""

    def __init__(self, cache: TieredCache, tokens: list[int], namespace: str) -> None:
        self.cache, self.tokens, self.namespace = cache, tokens, namespace
        match = cache.match(tokens, namespace)
        self.locked = match.device.nodes[-1] if match.device.num_pages else None
        if self.locked is not None:
            cache.lock(self.locked)
        self.page_table = list(match.device.pages)
        self.tree_pages = len(self.page_table)
        self.kv_len = self.tree_pages * PS

    def insert(self, kv_len: int, use_start: bool) -> InsertResult:
        full = kv_len // PS
        start = self.locked if use_start and self.tree_pages else None
        result = self.cache.insert(
            self.tokens[: full * PS],
            self.namespace,
            self.page_table[:full],
            start_node=start,
            start_pages=self.tree_pages if start is not None else 0,
        )
        if result.node is not None and result.node is not self.locked:
            self.cache.lock(result.node)
            if self.locked is not None:
                self.cache.unlock(self.locked)
            self.locked = result.node
        self.page_table[: result.num_pages] = result.device_pages
        self.tree_pages = result.num_pages
        if result.duplicate_pages:
            self.cache.free(result.duplicate_pages)
        return result

    def finish(self) -> None:
        self.cache.free(self.page_table[self.tree_pages :])
        if self.locked is not None:
            self.cache.unlock(self.locked)


def _run(seed: int, use_start: bool) -> list[tuple[object, ...]]:
    rng = random.Random(seed)
    cache, _ = make_cache(LAYOUT, device_pages=48)
    bases = [[rng.randint(0, 3) for _ in range(60)] for _ in range(3)]
    outcomes: list[tuple[object, ...]] = []
    running: list[_Request] = []
    for _ in range(60):
        if running and (len(running) > 2 or rng.random() < 0.5):
            request = running.pop(rng.randrange(len(running)))
            request.insert(len(request.tokens), use_start)
            request.finish()
            continue
        base = rng.choice(bases)
        tokens = base[: rng.randint(1, 60)] + [rng.randint(0, 3) for _ in range(rng.randint(0, 9))]
        namespace = rng.choice(["a", "b"])
        request = _Request(cache, tokens, namespace)
        pages = cache.allocate(-(-len(tokens) // PS) - len(request.page_table))
        if pages is None:
            request.finish()
            continue
        request.page_table.extend(pages)
        while request.kv_len < len(tokens):  # prefill chunk by chunk, insert at chunk ends
            request.kv_len = min(request.kv_len + rng.randint(1, 24), len(tokens))
            if request.kv_len // PS > request.tree_pages:
                outcomes.append(_comparable(request.insert(request.kv_len, use_start)))
        running.append(request)
        assert cache.check_integrity().ok
    return outcomes


@pytest.mark.parametrize("seed", range(6))
def test_insert_from_the_locked_node_equals_insert_from_the_root(seed: int) -> None:
    with_start, without = _run(seed, use_start=True), _run(seed, use_start=False)
    assert with_start == without
    assert sum(outcome[0] > 0 for outcome in with_start) > 5  # inserts did start below the root


def test_insert_refuses_a_start_node_at_the_wrong_depth() -> None:
    cache, _ = make_cache(LAYOUT, device_pages=8)
    pages = cache.allocate(2)
    assert pages is not None
    result = cache.insert(list(range(8)), "a", pages)
    assert result.node is not None and result.num_pages == 2
    with pytest.raises(AssertionError):
        cache.insert(list(range(12)), "a", [*pages, 7], start_node=result.node, start_pages=1)
    with pytest.raises(AssertionError):
        cache.insert(list(range(12)), "b", [*pages, 7], start_node=result.node, start_pages=2)
