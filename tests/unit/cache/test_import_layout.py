"""The cache's imports point one way, from the facade down: no module imports the facade, and
no import cycle remains among the cache's modules, type-only imports included."""

from __future__ import annotations

import ast
from pathlib import Path

import tieredkv.cache
from tests.import_graph import find_cycle, package_imports

CACHE_DIR = Path(tieredkv.cache.__file__).parent
FACADE = "tieredkv.cache.tiered_cache"


def cache_imports() -> dict[str, set[str]]:
    """Every cache module and the cache modules it imports (anywhere in its file)."""
    return package_imports(CACHE_DIR, "tieredkv.cache")


def test_the_cycle_finder_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_cache_module_imports_the_facade() -> None:
    graph = cache_imports()
    assert FACADE in graph and len(graph) > 30
    importers = sorted(m for m, imported in graph.items() if FACADE in imported)
    assert not importers, importers


def test_no_import_cycle_among_cache_modules() -> None:
    graph = cache_imports()
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or [])


def test_sub_packages_have_a_paragraph() -> None:
    for package in ("index", "pools", "disk", "transfer", "residency", "remote"):
        doc = ast.get_docstring(ast.parse((CACHE_DIR / package / "__init__.py").read_text()))
        assert doc and len(doc) > 200, package
