"""The engine's imports: no import cycle among its modules (type-only imports included), and
the cache reached only through its facade and a request's `CacheHandle`, never a tree node."""

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
}
# the facade's parts, which the engine must not reach through it
FACADE_PARTS = {"mover", "pools", "index", "tree", "residency", "promoter", "demoter"}


def test_no_import_cycle_among_engine_modules() -> None:
    graph = package_imports(ENGINE_DIR, "tieredkv.engine")
    assert {"tieredkv.engine.engine", "tieredkv.engine.metrics"} <= set(graph)
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or [])


def test_no_engine_module_imports_the_tree() -> None:
    for path in ENGINE_DIR.rglob("*.py"):
        assert not imported_modules(path) & NODE_MODULES, path.name


def test_the_engine_reaches_no_part_behind_the_cache_facade() -> None:
    for path in ENGINE_DIR.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and _names_the_cache(node.value):
                assert node.attr not in FACADE_PARTS, f"{path.name}:{node.lineno}"


def _names_the_cache(node: ast.expr) -> bool:
    """`cache` or `something.cache`: the facade."""
    name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")
    return name == "cache"
