"""vLLM's CPU server as its docs recommend (benchmarks/vllm_cpu.sh), what it ran with, and the
peak memory of a server's whole process tree.

The settings are read from the running server's own environment (/proc/PID/environ), so the
result records what vLLM saw, not what the script meant to set. Peak memory is taken two ways:
the largest sum of the tree's resident sets seen by a sampler (a peak between samples is
missed), and the sum of each process's own peak (VmHWM) over the processes alive at the end
(the processes need not peak together; one that exited earlier is not in it). Both count
tieredkv's workspace arena as far as sequences touched it, and vLLM's shared memory once per
process that maps it.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

import httpx

from benchmarks.machine_load import with_descendants
from tieredkv.bench.managed import free_port

HERE = Path(__file__).resolve().parent.parent
VLLM_SCRIPT = HERE / "vllm_cpu.sh"
VLLM_VENV = Path(os.environ.get("VLLM_VENV", "/tmp/vllm-cpu-venv"))
VLLM_SETTINGS = ("VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND", "LD_PRELOAD")
VLLM_SETTINGS += ("OMP_NUM_THREADS", "DTYPE", "MAX_MODEL_LEN")
START_TIMEOUT_S = 600
SAMPLE_INTERVAL_S = 0.2


def vllm_versions() -> dict:
    """vllm-cpu's and its torch's versions in the peer's venv, read from the package metadata."""
    code = "from importlib.metadata import version as v; print(v('vllm-cpu'), v('torch'))"
    python = str(VLLM_VENV / "bin" / "python")
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True)
    vllm, torch = out.stdout.split()
    return {"vllm": vllm, "torch": torch}


def process_settings(pid: int, names: tuple[str, ...] = VLLM_SETTINGS) -> dict:
    """The named variables of a running process's environment (absent ones left out)."""
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    env = dict(
        item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item
    )
    return {name: env[name] for name in names if name in env}


class VllmServer:
    """`vllm_cpu.sh serve KV_GIB PORT` in bfloat16; use as a context manager."""

    def __init__(self, kv_gib: int, max_model_len: int, log_path: Path) -> None:
        port = free_port()
        env = dict(os.environ, DTYPE="bfloat16", MAX_MODEL_LEN=str(max_model_len))
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            [str(VLLM_SCRIPT), "serve", str(kv_gib), str(port)],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        self.base_url = f"http://127.0.0.1:{port}"

    def wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"vLLM exited: see {self.log_path}")
            try:
                if httpx.get(self.base_url + "/health", timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(2)
        self.stop()
        raise RuntimeError(f"vLLM did not start in {START_TIMEOUT_S} s: see {self.log_path}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()

    def __enter__(self) -> VllmServer:
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _status_bytes(pid: int, field: str) -> int:
    """A /proc/PID/status field in bytes (kB there); 0 once the process is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


class TreeMemory:
    """`with TreeMemory(pid) as memory: ...`; then `memory.result()`: the peak resident bytes of
    `pid` and its descendants, sampled, and the sum of their own peaks (read before leaving)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak_rss_bytes = 0
        self.hwm_sum_bytes = 0
        self.processes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _tree_rss(self) -> tuple[int, int]:
        pids = with_descendants([self.pid])
        return sum(_status_bytes(pid, "VmRSS") for pid in pids), len(pids)

    def _sample(self) -> None:
        while not self._stop.wait(SAMPLE_INTERVAL_S):
            rss, _ = self._tree_rss()
            self.peak_rss_bytes = max(self.peak_rss_bytes, rss)

    def __enter__(self) -> TreeMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        rss, self.processes = self._tree_rss()
        self.peak_rss_bytes = max(self.peak_rss_bytes, rss)
        pids = with_descendants([self.pid])
        self.hwm_sum_bytes = sum(_status_bytes(pid, "VmHWM") for pid in pids)

    def result(self) -> dict:
        return {
            "peak_rss_bytes": self.peak_rss_bytes,
            "hwm_sum_bytes": self.hwm_sum_bytes,
            "processes": self.processes,
        }
