"""OtherLoad: the CPU the rest of the machine used while a benchmark measured its own
processes. The arithmetic on a /proc tree written by the test (descendants found through their
parents, a process started inside the window, one that exited), then on the real /proc: a
process outside the measured ones that burns a core is counted as others'."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.machine_load import (
    OtherLoad,
    _ticks_per_s,
    machine_cpu_ticks,
    process_ticks,
    with_descendants,
)


def write_stat(proc: Path, user: int, system: int, idle: int, iowait: int, steal: int = 0) -> None:
    # cpu user nice system idle iowait irq softirq steal guest guest_nice
    fields = f"{user} 0 {system} {idle} {iowait} 0 0 {steal} 0 0"
    (proc / "stat").write_text(f"cpu  {fields}\ncpu0 0\n")


def write_process(proc: Path, pid: int, ppid: int, utime: int, stime: int) -> None:
    (proc / str(pid)).mkdir(exist_ok=True)
    fields = ["S", str(ppid)] + ["0"] * 9 + [str(utime), str(stime)] + ["0"] * 10
    (proc / str(pid) / "stat").write_text(f"{pid} (a name) with spaces) {' '.join(fields)}\n")


def test_the_measured_tree_and_this_process_are_not_others(tmp_path: Path) -> None:
    me = os.getpid()
    write_stat(tmp_path, user=1000, system=500, idle=9000, iowait=300)
    write_process(tmp_path, me, 1, 10, 0)  # the benchmark itself
    write_process(tmp_path, 100, 1, 200, 100)  # the server
    write_process(tmp_path, 101, 100, 50, 0)  # its engine process, found through its parent
    write_process(tmp_path, 102, 100, 40, 0)  # a helper that exits inside the window
    write_process(tmp_path, 300, 1, 70, 0)  # someone else's
    assert with_descendants([100], tmp_path) == {100, 101, 102}
    assert machine_cpu_ticks(tmp_path) == (1500, 0)
    assert process_ticks(101, tmp_path) == 50 and process_ticks(999, tmp_path) == 0

    load = OtherLoad([100], tmp_path)
    with load:
        write_stat(tmp_path, user=1000 + 350, system=500 + 100, idle=9500, iowait=400, steal=50)
        write_process(tmp_path, me, 1, 10 + 20, 0)
        write_process(tmp_path, 100, 1, 200 + 150, 100 + 50)
        write_process(tmp_path, 101, 100, 50 + 100, 0)
        (tmp_path / "102" / "stat").unlink()  # exited: its time inside the window is lost
        write_process(tmp_path, 103, 101, 30, 0)  # started inside the window, below the server
        write_process(tmp_path, 300, 1, 70 + 150, 0)
    # 500 busy ticks: ours 20 + 200 + 100 + 30 = 350, the other 150 (someone else's 100, and
    # 50 the hypervisor gave to other machines)
    assert load.others_cpu_s == pytest.approx(150 / _ticks_per_s())
    assert load.others_cores is not None and load.steal_cores is not None
    assert load.steal_cores == pytest.approx(load.others_cores / 3)


def test_without_proc_the_figure_is_unknown(tmp_path: Path) -> None:
    with OtherLoad([1], tmp_path / "absent") as load:
        pass
    assert load.others_cpu_s is None and load.others_cores is None and load.steal_cores is None


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="needs Linux's /proc")
def test_a_process_outside_the_measured_ones_is_counted() -> None:
    # the burner is orphaned (its shell exits), so it is no descendant of this process
    burn = f"{sys.executable} -c 'import time; t = time.time() + 3\nwhile time.time() < t: pass'"
    shell = subprocess.run(
        ["sh", "-c", f"{burn} >/dev/null 2>&1 & echo $!"], capture_output=True, text=True
    )
    burner = int(shell.stdout.strip())
    assert burner not in with_descendants([os.getpid()])
    try:
        time.sleep(0.2)
        before = process_ticks(burner)
        with OtherLoad([]) as load:
            time.sleep(1.0)
        used = process_ticks(burner) - before
    finally:
        subprocess.run(["kill", str(burner)], check=False)
    assert used > 0  # it ran: whatever it got of the cores counts as others'
    assert load.others_cpu_s is not None
    assert load.others_cpu_s >= (used - 2) / _ticks_per_s()  # 2 ticks: the snapshots' skew
