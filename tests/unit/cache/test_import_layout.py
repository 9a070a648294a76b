"""The cache's imports point one way, from the facade down: no module imports the facade, and
no import cycle remains among the cache's modules, type-only imports included."""

from __future__ import annotations

import ast
from pathlib import Path

import tieredkv.cache

CACHE_DIR = Path(tieredkv.cache.__file__).parent
FACADE = "tieredkv.cache.tiered_cache"
ON_TOP = {FACADE, "tieredkv.cache.testing"}  # test support builds a facade


def _module_name(path: Path) -> str:
    parts = path.relative_to(CACHE_DIR.parent.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def cache_imports() -> dict[str, set[str]]:
    """Every cache module and the cache modules it imports (anywhere in its file)."""
    graph: dict[str, set[str]] = {}
    for path in CACHE_DIR.rglob("*.py"):
        imported: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                imported.add(node.module)
            elif isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
        graph[_module_name(path)] = {m for m in imported if m.startswith("tieredkv.cache")}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle, as the modules around it, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    stack: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        stack.append(module)
        for imported in sorted(graph.get(module, ())):
            if state.get(imported) == 1:
                return [*stack[stack.index(imported) :], imported]
            if imported not in state and (found := visit(imported)):
                return found
        stack.pop()
        state[module] = 2
        return None

    for module in sorted(graph):
        if module not in state and (found := visit(module)):
            return found
    return None


def test_the_cycle_finder_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycle(graph) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_no_cache_module_imports_the_facade() -> None:
    graph = cache_imports()
    assert FACADE in graph and len(graph) > 30
    importers = sorted(m for m, imported in graph.items() if FACADE in imported)
    assert set(importers) <= ON_TOP - {FACADE}, importers


def test_no_import_cycle_among_cache_modules() -> None:
    graph = cache_imports()
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


def test_sub_packages_have_a_paragraph() -> None:
    for package in ("index", "pools", "disk", "transfer", "residency"):
        doc = ast.get_docstring(ast.parse((CACHE_DIR / package / "__init__.py").read_text()))
        assert doc and len(doc) > 200, package
