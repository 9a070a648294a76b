"""`ManualTransferExecutor`: a transfer executor whose jobs run only when the test says so."""

from __future__ import annotations

import errno
from typing import Any

from tieredkv.cache.transfer.executors import Report, TransferJob


class ManualTransferExecutor:
    """Holds jobs until a test says `complete(ticket)` or `fail(ticket)`, in any order."""

    def __init__(self) -> None:
        self._pending: dict[int, tuple[Any, TransferJob, Report]] = {}  # by id(ticket)

    def submit(self, ticket: Any, job: TransferJob, report: Report) -> None:
        self._pending[id(ticket)] = (ticket, job, report)

    def pending(self) -> list[Any]:
        """Tickets submitted and neither completed nor failed yet, oldest first."""
        return [ticket for ticket, _, _ in self._pending.values()]

    def complete(self, ticket: Any) -> None:
        """Run the copy now, on the calling thread, and report its outcome as a worker would:
        an exception from the job becomes a failed ticket."""
        _, job, report = self._pending.pop(id(ticket))
        try:
            page_ok = job()
        except Exception as error:
            report(None, error)
        else:
            report(page_ok, None)

    def fail(self, ticket: Any, error: BaseException | None = None) -> None:
        """Report the transfer failed without copying anything."""
        _, _, report = self._pending.pop(id(ticket))
        report(None, error or OSError(errno.EIO, "injected transfer failure"))

    def complete_all(self) -> None:
        for ticket in self.pending():
            self.complete(ticket)

    def shutdown(self) -> None:
        """Tests decide what happens to pending jobs; nothing runs here."""
