"""`NoTransferExecutor`: the executor of a device-only cache, which moves no page between tiers.

The radix measurements time the tree alone: no transfer thread runs behind the timed calls' backs,
and a transfer submitted all the same is a mistake in the benchmark, not a cost to measure.
"""

from __future__ import annotations

from typing import Any

from tieredkv.cache.transfer.executors import Report, TransferJob


class NoTransferExecutor:
    """Starts no thread; refuses every transfer."""

    def submit(self, ticket: Any, job: TransferJob, report: Report) -> None:
        raise AssertionError(f"a device-only cache submitted a transfer: {ticket!r}")

    def shutdown(self) -> None:
        """Nothing runs, so nothing stops."""
