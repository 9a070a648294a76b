"""The installed library never imports the test suite or the research scripts: what the
benchmarks need (the Redis and router launchers among them) lives in `tieredkv.bench`."""

from __future__ import annotations

from pathlib import Path

import tieredkv
from tests.import_graph import imported_modules

OUTSIDE = {"tests", "benchmarks"}


def test_no_tieredkv_module_imports_tests_or_benchmarks() -> None:
    package = Path(tieredkv.__file__).parent
    paths = list(package.rglob("*.py"))
    assert len(paths) > 50
    for path in paths:
        outside = {m for m in imported_modules(path) if m.split(".")[0] in OUTSIDE}
        assert not outside, (path, outside)
