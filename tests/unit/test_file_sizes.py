"""No module of the library, the server or the kernels grows past MAX_LINES lines: past it, a
module holds more than one concept and is split by responsibility."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("tieredkv", "server", "kernels")
MAX_LINES = 350


def _line_counts() -> dict[str, int]:
    return {
        path.relative_to(ROOT).as_posix(): len(path.read_text(encoding="utf-8").splitlines())
        for top in PACKAGES
        for path in sorted((ROOT / top).rglob("*.py"))
    }


def test_the_line_counter_sees_every_package() -> None:
    counts = _line_counts()
    for top in PACKAGES:
        assert any(name.startswith(f"{top}/") for name in counts), top
    assert counts["tieredkv/cli.py"] > 50


def test_no_library_file_is_over_the_limit() -> None:
    too_long = {name: lines for name, lines in _line_counts().items() if lines > MAX_LINES}
    assert not too_long, f"over {MAX_LINES} lines (split by responsibility): {too_long}"
