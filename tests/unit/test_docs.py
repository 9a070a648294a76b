"""The documentation: a short README that starts with the two commands, relative links (and
their anchors) that resolve inside the repository, and a configuration page that matches the
CLI's parser."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from tieredkv.cli_parser import build_parser
from tieredkv.cli_reference import render

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
MAX_README_LINES = 350
TWO_COMMANDS = [
    "```",
    "make serve   # installs into .venv if needed, starts the server on the default model at "
    "127.0.0.1:8000",
    "make test    # installs into .venv if needed, runs the test suite",
    "```",
]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def _documents() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lowercase, punctuation dropped, spaces to hyphens."""
    text = heading.strip().lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    return {_slug(m.group(1)) for m in re.finditer(r"^#+\s+(.+)$", text, re.MULTILINE)}


def _links(path: Path) -> list[str]:
    return LINK.findall(FENCE.sub("", path.read_text(encoding="utf-8")))


def test_readme_is_short_and_starts_with_the_two_commands() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines"
    assert lines[0].startswith("# "), f"the README opens with its title, not {lines[0]!r}"
    body = [line for line in lines[1:] if line.strip()]
    assert body[: len(TWO_COMMANDS)] == TWO_COMMANDS


def test_every_relative_link_resolves_inside_the_repository() -> None:
    broken = []
    for document in _documents():
        for target in _links(document):
            if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
                continue
            file_part, _, anchor = target.partition("#")
            linked = (document.parent / file_part).resolve() if file_part else document
            where = f"{document.relative_to(ROOT)}: {target}"
            if not linked.is_relative_to(ROOT):
                broken.append(f"{where} (outside the repository)")
            elif not linked.exists():
                broken.append(f"{where} (no such file)")
            elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
                broken.append(f"{where} (no such heading)")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_the_docs_link_checker_sees_links() -> None:
    """The checker above would pass vacuously if it found no links at all."""
    targets = {target for document in _documents() for target in _links(document)}
    assert "docs/configuration.md" in targets
    assert _slug("Namespaces: `cache_salt` and `X-Cache-Namespace`") == (
        "namespaces-cache_salt-and-x-cache-namespace"
    )


def test_configuration_doc_is_generated_from_the_parser() -> None:
    committed = (DOCS / "configuration.md").read_text(encoding="utf-8")
    assert committed == render(), (
        "docs/configuration.md is stale: run `make docs` "
        "(python -m tieredkv.cli_reference --out docs/configuration.md)"
    )


def _serve_options() -> list[str]:
    """Every long option of `tieredkv serve`, in the parser's order."""
    subcommands = next(
        action
        for action in build_parser()._actions
        if isinstance(action, argparse._SubParsersAction)
    )
    return [
        option
        for action in subcommands.choices["serve"]._actions
        if not isinstance(action, argparse._HelpAction)
        for option in action.option_strings
        if option.startswith("--")
    ]


def test_configuration_doc_lists_every_serve_option() -> None:
    options = _serve_options()
    assert "--disk-cache-dir" in options and "--remote-cache-url" in options
    text = render()
    missing = [option for option in options if f"`{option}" not in text]
    assert not missing, f"flags missing from docs/configuration.md: {missing}"


def test_operations_doc_names_every_exported_metric() -> None:
    from tieredkv.engine.metrics import EngineMetrics

    exported = [
        line.split()[2]
        for line in EngineMetrics().render().splitlines()
        if line.startswith("# TYPE")
    ]
    assert "tieredkv_cache_hit_tokens_total" in exported
    text = (DOCS / "operations.md").read_text(encoding="utf-8")
    missing = [name for name in exported if f"`{name}`" not in text]
    assert not missing, f"metrics missing from docs/operations.md: {missing}"


def test_architecture_module_map_names_every_module() -> None:
    """Every module of the library, the server and the kernels (the benchmarks' modules are
    described as a group) has its line in docs/architecture.md's module map."""
    text = (DOCS / "architecture.md").read_text(encoding="utf-8")
    modules = [
        path
        for top in ("tieredkv", "server", "kernels")
        for path in sorted((ROOT / top).rglob("*"))
        if path.suffix in (".py", ".c")
        and path.name != "__init__.py"
        and "bench" not in path.relative_to(ROOT).parts
    ]
    assert len(modules) > 50
    missing = [
        path.relative_to(ROOT).as_posix()
        for path in modules
        if not re.search(r"[`/]" + re.escape(path.name) + "`", text)
    ]
    assert not missing, f"modules missing from the module map: {missing}"
