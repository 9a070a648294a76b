"""No file of the product tells the project's history: no work periods or issue numbers in the
README, docs/, the code, the tests or the benchmarks. Measurements and history belong in commit
messages; comments and docs say why the code is as it is."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("README.md", "docs", "tieredkv", "server", "kernels", "tests", "benchmarks")
SUFFIXES = {".py", ".md", ".sh", ".toml", ".yml", ".txt"}
SKIPPED = (ROOT / "benchmarks" / "results",)
# Built from pieces so that this file does not match itself.
_NUMBER = r"\s+\d+\b"
HISTORY = re.compile(
    "|".join(
        (
            r"\b" + "sess" + r"ions?" + _NUMBER,
            r"\b" + "iss" + r"ues?\s+#?\d+\b",
            r"\(" + "#" + r"\d+\)",
        )
    ),
    re.IGNORECASE,
)


def _text_files() -> list[Path]:
    files = []
    for name in SCANNED:
        top = ROOT / name
        candidates = [top] if top.is_file() else top.rglob("*")
        for path in candidates:
            if path.suffix not in SUFFIXES or not path.is_file():
                continue
            if "__pycache__" in path.parts or any(path.is_relative_to(s) for s in SKIPPED):
                continue
            files.append(path)
    return sorted(files)


def _history_lines(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8", errors="replace")
    return [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()[:120]}"
        for number, line in enumerate(text.splitlines(), start=1)
        if HISTORY.search(line)
    ]


def test_the_pattern_catches_history_and_not_ordinary_words() -> None:
    caught = ["as measured in sess" + "ion 14", "see iss" + "ue #15", "tenants (" + "#15)"]
    caught.append("Sess" + "ions 2 and 3")
    assert all(HISTORY.search(text) for text in caught)
    assert not HISTORY.search("a session's pages stay on host for 60 s; the issue is the lock")


def test_the_scan_covers_the_product() -> None:
    scanned = {path.relative_to(ROOT).as_posix() for path in _text_files()}
    assert {"README.md", "tieredkv/cli.py", "server/app.py", "kernels/reference.py"} <= scanned
    assert "tests/unit/test_no_history.py" in scanned
    assert not any(name.startswith("benchmarks/results/") for name in scanned)


def test_no_file_tells_the_project_history() -> None:
    found = [line for path in _text_files() for line in _history_lines(path)]
    assert not found, "history belongs in commit messages, not in files:\n" + "\n".join(found)
