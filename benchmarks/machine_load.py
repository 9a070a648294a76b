"""How much CPU other processes took while a benchmark measured its own.

This machine is shared: another engineer's process can slow one sample and not the next, and a
figure that moved for that reason looks like a regression of the code under test. Beside each
figure a benchmark can show the cores the rest of the machine used during its samples, so such
a sample shows. From /proc: the machine's busy time (/proc/stat, all but idle and iowait) minus
the CPU time of the processes under measurement, their descendants and the benchmark itself
(/proc/PID/stat utime + stime, every thread included). A measured process that exits inside
the window takes its time with it and counts as another's. Linux only: elsewhere, and where
/proc cannot be read, the figure is None.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from pathlib import Path

PROC = Path("/proc")


def _ticks_per_s() -> int:
    try:
        return os.sysconf("SC_CLK_TCK")
    except (AttributeError, ValueError, OSError):
        return 100


def machine_cpu_ticks(proc: Path = PROC) -> tuple[int, int] | None:
    """All cores' busy time since boot and the part of it the hypervisor gave to other
    machines (steal), in clock ticks (None without /proc)."""
    try:
        with open(proc / "stat") as stat:
            fields = [int(value) for value in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle, iowait, steal = fields[3], fields[4], fields[7]
    return sum(fields[:8]) - idle - iowait, steal  # user nice system idle iowait irq softirq steal


def _stat_fields(pid: int, proc: Path) -> list[str] | None:
    """/proc/PID/stat's fields after the command name (which may hold spaces)."""
    try:
        text = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()


def process_ticks(pid: int, proc: Path = PROC) -> int:
    """The process's CPU time (all its threads), in clock ticks; 0 once it is gone."""
    fields = _stat_fields(pid, proc)
    return int(fields[11]) + int(fields[12]) if fields else 0  # utime, stime


def with_descendants(roots: Iterable[int], proc: Path = PROC) -> set[int]:
    """`roots` and every process below them now."""
    children: dict[int, list[int]] = {}
    try:
        entries = list(proc.iterdir())
    except OSError:
        entries = []
    for entry in entries:
        if entry.name.isdigit() and (fields := _stat_fields(int(entry.name), proc)):
            children.setdefault(int(fields[1]), []).append(int(entry.name))  # ppid
    found = set(roots)
    pending = list(found)
    while pending:
        for child in children.get(pending.pop(), ()):
            if child not in found:
                found.add(child)
                pending.append(child)
    return found


class OtherLoad:
    """`with OtherLoad(pids) as load: ...`; then `load.others_cores`: the average number of
    cores that processes outside `pids`, their descendants and this one used meanwhile, and of
    those `load.steal_cores`: time the hypervisor gave to other virtual machines."""

    def __init__(self, pids: Iterable[int], proc: Path = PROC) -> None:
        self.roots = {*pids, os.getpid()}
        self.proc = proc
        self.others_cpu_s: float | None = None  # CPU seconds
        self.others_cores: float | None = None  # the same over the window's wall time
        self.steal_cores: float | None = None  # the part of it stolen by the hypervisor

    def _snapshot(self) -> tuple[tuple[int, int] | None, dict[int, int], float]:
        pids = with_descendants(self.roots, self.proc)
        ticks = {pid: process_ticks(pid, self.proc) for pid in pids}
        return machine_cpu_ticks(self.proc), ticks, time.monotonic()

    def __enter__(self) -> OtherLoad:
        self._start = self._snapshot()
        return self

    def __exit__(self, *exc_info: object) -> None:
        machine_end, ours_end, end = self._snapshot()
        machine_start, ours_start, start = self._start
        if machine_start is None or machine_end is None or end <= start:
            return
        busy = machine_end[0] - machine_start[0]
        steal = machine_end[1] - machine_start[1]
        # a process that started inside the window counts from 0; one that ended, not at all
        ours = sum(ticks - ours_start.get(pid, 0) for pid, ticks in ours_end.items())
        self.others_cpu_s = max(0, busy - ours) / _ticks_per_s()
        self.others_cores = self.others_cpu_s / (end - start)
        self.steal_cores = steal / _ticks_per_s() / (end - start)
