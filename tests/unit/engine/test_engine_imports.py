"""The engine's imports: no import cycle among its modules (type-only imports included), and
the cache reached only through its facade's cache-wide calls and a request's `CacheHandle`,
never a tree node, a node-level call or a part behind the facade."""

from __future__ import annotations

import ast
from pathlib import Path

import tieredkv.engine
from tests.import_graph import find_cycle, imported_modules, package_imports

ENGINE_DIR = Path(tieredkv.engine.__file__).parent
# the cache's modules that hold or hand out tree nodes
NODE_MODULES = {
    "tieredkv.cache.index.radix_node",
    "tieredkv.cache.index.radix_tree",
    "tieredkv.cache.index.radix_index",
    "tieredkv.cache.index.match_results",
    "tieredkv.cache.residency.promotion",
    "tieredkv.cache.residency.residence",
}
# the facade's parts, which the engine must not reach through it
FACADE_PARTS = {
    "transfer_queue",
    "pools",
    "device_pool",
    "host_pool",
    "index",
    "tree",
    "residency",
    "promoter",
    "demoter",
}
# the facade's node-level calls: a request's pages go through its `CacheHandle` instead
NODE_CALLS = {"match", "insert", "lock", "unlock"}


def test_no_import_cycle_among_engine_modules() -> None:
    graph = package_imports(ENGINE_DIR, "tieredkv.engine")
    assert {"tieredkv.engine.engine", "tieredkv.engine.metrics"} <= set(graph)
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or [])


def test_no_engine_module_imports_the_tree() -> None:
    for path in ENGINE_DIR.rglob("*.py"):
        assert not imported_modules(path) & NODE_MODULES, path.name


def test_the_engine_reaches_no_part_behind_the_cache_facade() -> None:
    for path in ENGINE_DIR.rglob("*.py"):
        assert reaches_behind_the_facade(path.read_text()) == [], path.name


def test_the_check_finds_every_way_behind_the_facade() -> None:
    behind = """
match = self.cache.match(fork.packed_tokens, fork.spec.namespace)
self.cache.device_pool.copy_pages(parent.page_table[0:1], fork.page_table[0:1])
pages = self.cache.device_pool.num_pages
cache.insert(tokens, namespace, pages)
self._cache.lock(node)
engine.cache.unlock(node)
free = engine.cache.host_pool.num_free
copy = cache.pools.device
"""
    assert reaches_behind_the_facade(behind) == list(range(2, 10))
    allowed = """
request.kv.insert(request.packed_tokens)
request.kv.copy_pages_from(parent.kv, 4, 5)
self.cache.poll()
runner = ModelRunner(config, weights, cache.device_pool, max_model_len)
"""
    assert reaches_behind_the_facade(allowed) == []


def reaches_behind_the_facade(source: str) -> list[int]:
    """The lines that name a node-level call of the cache or a part behind it. The one
    exception: the model runner is built on the cache's device pool (`ModelRunner(...,
    cache.device_pool, ...)`), the pages it computes in."""
    tree = ast.parse(source)
    runner_args = {
        id(arg)
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "ModelRunner"
        for arg in [*node.args, *(keyword.value for keyword in node.keywords)]
    }
    return sorted(
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and _names_the_cache(node.value)
        and node.attr in FACADE_PARTS | NODE_CALLS
        and id(node) not in runner_args
    )


def _names_the_cache(node: ast.expr) -> bool:
    """`cache`, `_cache` or `something.cache`: the facade."""
    name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")
    return name.lstrip("_") == "cache"
