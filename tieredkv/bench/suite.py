"""The managed benchmark: tieredkv started by the benchmark itself, in one or more
configurations, beside the recompute baseline (`--no-cache`, same binary). Every tieredkv run
gets a fresh disk store in a temp dir (under `work_dir`, whose filesystem the disk limit is
probed on), dropped from the page cache before each timed round."""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Callable
from pathlib import Path

from tieredkv.bench.disk_check import drop_page_cache
from tieredkv.bench.driver import ArrivalConfig
from tieredkv.bench.managed import ManagedServer
from tieredkv.bench.workload import Workload
from tieredkv.bench.workload_run import run_workload


@dataclasses.dataclass(frozen=True)
class ServerSpec:
    """One tieredkv configuration to run the workload against."""

    label: str
    device_cache: str
    host_cache: str
    disk_cache: str = "0"
    page_size: int | None = None  # None: the server's default
    write_policy: str | None = None
    no_cache: bool = False

    def args(self, common: list[str], disk_dir: Path) -> list[str]:
        args = [*common, "--device-cache-size", self.device_cache]
        args += ["--host-cache-size", self.host_cache]
        if self.no_cache:
            return [*args, "--no-cache"]
        if self.disk_cache != "0":
            args += ["--disk-cache-dir", str(disk_dir), "--disk-cache-size", self.disk_cache]
        if self.page_size is not None:
            args += ["--page-size", str(self.page_size)]
        if self.write_policy is not None:
            args += ["--write-policy", self.write_policy]
        return args


@dataclasses.dataclass(frozen=True)
class SuiteConfig:
    common_args: list[str]  # --dtype, --max-model-len, --model ... shared by every server
    work_dir: Path  # logs and the disk stores (its filesystem is the one measured)
    threads: int | None = None
    disk_probe_bytes: int = 256 * 2**20
    extra_body: dict | None = None  # added to every request (e.g. ignore_eos)


def run_server(
    spec: ServerSpec,
    suite: SuiteConfig,
    workload: Workload,
    arrival: ArrivalConfig,
) -> dict:
    """Start tieredkv as `spec`, run the workload, stop it; the run's result plus how it ran."""
    with tempfile.TemporaryDirectory(prefix="kv-", dir=suite.work_dir) as disk_text:
        disk_dir = Path(disk_text)
        args = spec.args(suite.common_args, disk_dir)
        log_path = suite.work_dir / f"{spec.label}.log"
        dropped: list[int] = []

        def before_round(_round: int) -> None:
            if spec.disk_cache != "0" and not spec.no_cache:
                dropped.append(drop_page_cache(disk_dir))

        with ManagedServer(args, log_path, suite.threads) as server:
            result = run_workload(
                server.base_url, workload, arrival, before_round, spec.label, None, suite.extra_body
            )
        result["server"] = "tieredkv"
        result["spec"] = dataclasses.asdict(spec)
        result["server_args"] = args
        result["page_cache_dropped_bytes"] = dropped
        result["log"] = str(log_path)
        return result


def run_all(
    specs: list[ServerSpec],
    suite: SuiteConfig,
    workload: Workload,
    arrival: ArrivalConfig,
    on_result: Callable[[dict], None] | None = None,
) -> list[dict]:
    """Run every spec in order; `on_result` sees each run as it finishes (partial reports)."""
    results = []
    for spec in specs:
        results.append(run_server(spec, suite, workload, arrival))
        if on_result is not None:
            on_result(results[-1])
    return results
