"""The cache's imports point one way, from the facade down: no module imports the facade, and
no import cycle remains among the cache's modules, nor among its sub-packages (each top-level
module its own part), type-only imports included. The sub-packages stand in layers, each
importing only from the layers below it: the two stores are peers, neither imports the other."""

from __future__ import annotations

import ast
from pathlib import Path

import tieredkv.cache
from tests.import_graph import find_cycle, package_imports, part_imports

CACHE = "tieredkv.cache"
CACHE_DIR = Path(tieredkv.cache.__file__).parent
FACADE = "tieredkv.cache.tiered_cache"
# build makes the facade, and a request's handle is built on it
ON_TOP = {FACADE, "tieredkv.cache.build", "tieredkv.cache.cache_handle"}
# the sub-packages, lowest first: a sub-package imports only from the layers below its own
LAYERS = ({"index", "pools"}, {"disk", "remote"}, {"transfer"}, {"residency"})


def cache_imports() -> dict[str, set[str]]:
    """Every cache module and the cache modules it imports (anywhere in its file)."""
    return package_imports(CACHE_DIR, CACHE)


def cache_part_imports() -> dict[str, set[str]]:
    """Every part of the cache (a sub-package, or a top-level module) and the parts it
    imports."""
    return part_imports(cache_imports(), CACHE)


def test_the_cycle_finder_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_cycle_finder_finds_a_cycle_between_packages() -> None:
    modules = {
        "p.a.x": {"p.b.y"},  # a -> b
        "p.b.y": {"p.tier"},
        "p.b.z": {"p.a.w"},  # b -> a
        "p.a.w": {"p.tier"},
        "p.tier": set(),
    }
    assert find_cycle(modules) is None
    parts = part_imports(modules, "p")
    assert parts == {"a": {"b", "tier"}, "b": {"a", "tier"}, "tier": set()}
    assert find_cycle(parts) == ["a", "b", "a"]
    del modules["p.b.z"]
    assert find_cycle(part_imports(modules, "p")) is None


def test_no_cache_module_imports_the_facade() -> None:
    graph = cache_imports()
    assert FACADE in graph and len(graph) > 30
    importers = sorted(m for m, imported in graph.items() if FACADE in imported)
    assert set(importers) <= ON_TOP - {FACADE}, importers


def test_no_import_cycle_among_cache_modules() -> None:
    graph = cache_imports()
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or [])


def test_no_import_cycle_among_cache_sub_packages() -> None:
    graph = cache_part_imports()
    assert {"index", "pools", "disk", "remote", "transfer", "residency", "tier"} <= set(graph)
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or [])


def test_sub_packages_import_only_the_layers_below() -> None:
    graph = cache_part_imports()
    for level, layer in enumerate(LAYERS):
        not_below = set().union(*LAYERS[level:])
        for package in layer:
            assert not graph[package] & not_below, (package, sorted(graph[package] & not_below))


def test_sub_packages_have_a_paragraph() -> None:
    for package in ("index", "pools", "disk", "transfer", "residency", "remote"):
        doc = ast.get_docstring(ast.parse((CACHE_DIR / package / "__init__.py").read_text()))
        assert doc and len(doc) > 200, package


NODE_MODULE = "tieredkv.cache.index.radix_node"
NODE_OWNERS = ("tieredkv.cache.index.", "tieredkv.cache.residency.")  # the index and residency
REPO_DIR = CACHE_DIR.parent.parent


def _imports_the_node(path: Path) -> bool:
    """Does `path` import the node's module (`import`, `from ... import`, type-only too)?"""
    package, _, name = NODE_MODULE.rpartition(".")
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            names = {alias.name for alias in node.names}
            if node.module == NODE_MODULE or (node.module == package and name in names):
                return True
        if isinstance(node, ast.Import) and any(a.name == NODE_MODULE for a in node.names):
            return True
    return False


def test_only_the_index_and_residency_import_the_node() -> None:
    importers = set()
    for top in ("tieredkv", "server", "kernels"):
        for path in (REPO_DIR / top).rglob("*.py"):
            if _imports_the_node(path):
                importers.add(".".join(path.relative_to(REPO_DIR).with_suffix("").parts))
    assert "tieredkv.cache.residency.warm_restart" in importers  # a type-only import counts
    outside = sorted(m for m in importers if not m.startswith(NODE_OWNERS))
    assert not outside, outside
