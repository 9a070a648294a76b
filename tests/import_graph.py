"""The import graph of a tieredkv package, read with ast (type-only imports included), the
same graph between its sub-packages, and a cycle finder: what the import-layout tests check."""

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


def part_of(module: str, package: str) -> str:
    """The part of `package` that `module` belongs to: its sub-package (`package.disk.store` ->
    `disk`), or the module itself when it sits at the top (`package.tier` -> `tier`)."""
    if module == package:
        return package
    assert module.startswith(package + "."), f"{module} is not in {package}"
    return module[len(package) + 1 :].split(".")[0]


def part_imports(module_imports: dict[str, set[str]], package: str) -> dict[str, set[str]]:
    """`module_imports` between the parts of `package` (see `part_of`): part A imports part B
    when any module of A imports any module of B."""
    graph: dict[str, set[str]] = {}
    for module, imported in module_imports.items():
        part = part_of(module, package)
        graph.setdefault(part, set()).update(
            other for other in (part_of(name, package) for name in imported) if other != part
        )
    return graph


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
