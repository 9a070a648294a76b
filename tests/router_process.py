"""SGLang's real router (`sglang-router`) for the tests that put tieredkv replicas behind it:
the benchmark's launcher (`benchmarks.router`), skipped where the dev extra is missing."""

from __future__ import annotations

import os

import pytest

from benchmarks import router as bench_router
from benchmarks.router import RouterProcess

__all__ = ["RouterProcess", "require_router"]


def require_router() -> None:
    """Skip when sglang-router (the dev extra) is missing, except on CI."""
    try:
        bench_router.require_router()
    except bench_router.RouterMissingError as exc:
        if os.environ.get("CI"):
            pytest.fail(f"{exc}; CI must install the dev extra")
        pytest.skip(str(exc))
