"""`tieredkv serve`'s preload: which libraries, when it re-executes, and never twice."""

import sys
from pathlib import Path

import pytest

from tieredkv import preload


def test_libraries_found_are_real_files() -> None:
    for path in preload.preload_libraries():
        assert Path(path).is_file()
        assert "tcmalloc" in path or "libiomp5" in path


@pytest.fixture
def exec_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    calls: list[tuple] = []
    monkeypatch.setattr(preload.os, "execve", lambda *args: calls.append(args))
    monkeypatch.setattr(preload, "preload_libraries", lambda: ["/lib/libtcmalloc_minimal.so.4"])
    for name in ("LD_PRELOAD", "TIEREDKV_PRELOADED", "TIEREDKV_NO_PRELOAD", "KMP_BLOCKTIME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("TCMALLOC_RELEASE_RATE", raising=False)
    return calls


def test_reexecutes_itself_once_with_the_library_preloaded(exec_calls, monkeypatch) -> None:
    monkeypatch.setenv("LD_PRELOAD", "/other/lib.so")
    preload.reexec_with_preload()
    ((path, argv, env),) = exec_calls
    assert path == sys.executable and argv == sys.orig_argv
    assert env["LD_PRELOAD"] == "/lib/libtcmalloc_minimal.so.4 /other/lib.so"
    assert env["TIEREDKV_PRELOADED"] == "1"
    assert "KMP_BLOCKTIME" not in env  # no Intel OpenMP preloaded: nothing to tune
    monkeypatch.setenv("TIEREDKV_PRELOADED", "1")  # the re-executed process: no loop
    preload.reexec_with_preload()
    assert len(exec_calls) == 1


def test_nothing_to_do_when_loaded_or_opted_out(exec_calls, monkeypatch) -> None:
    monkeypatch.setenv("LD_PRELOAD", "/elsewhere/libtcmalloc_minimal.so.4")
    preload.reexec_with_preload()
    monkeypatch.delenv("LD_PRELOAD")
    monkeypatch.setenv("TIEREDKV_NO_PRELOAD", "1")
    preload.reexec_with_preload()
    assert exec_calls == []


def test_intel_openmp_sleeps_after_5_ms_unless_told_otherwise(exec_calls, monkeypatch) -> None:
    """Its threads spin 200 ms after a parallel region by default, taking the cores from
    whatever runs next (another replica, a promotion's copies); vLLM's CPU worker sets 5."""
    iomp = "/venv/lib/libiomp5.so"
    monkeypatch.setattr(preload, "preload_libraries", lambda: ["/lib/libtcmalloc.so.4", iomp])
    preload.reexec_with_preload()
    monkeypatch.setenv("KMP_BLOCKTIME", "200")
    preload.reexec_with_preload()
    assert [env["KMP_BLOCKTIME"] for _, _, env in exec_calls] == ["5", "200"]


def test_tcmalloc_keeps_freed_memory_unless_told_otherwise(exec_calls, monkeypatch) -> None:
    """Memory handed back to the kernel faults in again on the next step (hundreds of faults in
    a turn after a long prefill); only a preloaded tcmalloc is tuned."""
    preload.reexec_with_preload()
    monkeypatch.setenv("TCMALLOC_RELEASE_RATE", "1")
    preload.reexec_with_preload()
    monkeypatch.delenv("TCMALLOC_RELEASE_RATE")
    monkeypatch.setattr(preload, "preload_libraries", lambda: ["/venv/lib/libiomp5.so"])
    preload.reexec_with_preload()
    rates = [env.get("TCMALLOC_RELEASE_RATE") for _, _, env in exec_calls]
    assert rates == ["0", "1", None]
