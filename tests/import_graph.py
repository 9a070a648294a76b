"""The import graph of a tieredkv package, read with ast (type-only imports included), and a
cycle finder: what the import-layout tests check."""

from __future__ import annotations

import ast
from pathlib import Path


def module_name(path: Path, package_dir: Path) -> str:
    parts = path.relative_to(package_dir.parent.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path) -> set[str]:
    """Every module `path` imports, anywhere in its file."""
    imported: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module)
        elif isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
    return imported


def package_imports(package_dir: Path, prefix: str) -> dict[str, set[str]]:
    """Every module of the package at `package_dir` and the modules named `prefix*` it
    imports."""
    return {
        module_name(path, package_dir): {m for m in imported_modules(path) if m.startswith(prefix)}
        for path in package_dir.rglob("*.py")
    }


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
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
