"""The checks `tieredkv serve` makes of its flags before anything slow happens, and its errors
in the user's terms (flag names, not the config classes behind them).

The disk tier is on when `--disk-cache-dir` is given: its size defaults to DEFAULT_DISK_CACHE,
a size without a directory is an error (it would silently give no disk tier), a directory that
does not exist is created only where its parent does (a typo is not created), and a size larger
than the filesystem's free space less DISK_SPARE_BYTES is refused before the store file is
preallocated.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from tieredkv.errors import ConfigError

DEFAULT_DISK_CACHE = "16GiB"
DISK_SPARE_BYTES = 1 << 30  # left free on the disk tier's filesystem for everything else
GIB = 1 << 30

# The config field behind each flag, so that a config's error names the flag the user typed
FLAG_OF_FIELD = {
    "CacheConfig.page_size": "--page-size",
    "CacheConfig.device_cache_bytes": "--device-cache-size",
    "CacheConfig.host_cache_bytes": "--host-cache-size",
    "CacheConfig.workspace_bytes": "--workspace-size",
    "CacheConfig.disk_cache_bytes": "--disk-cache-size",
    "CacheConfig.remote_budget_scale": "--remote-budget-scale",
    "CacheConfig.namespace_share": "--namespace-share",
    "CacheConfig.host_whole_pages": "--host-whole-pages",
    "CacheConfig.device_whole_pages": "--device-whole-pages",
    "CacheConfig.disk_whole_pages": "--disk-whole-pages",
    "CacheConfig.pin_budget_bytes": "--pin-budget",
    "CacheConfig.pin_budget_total_bytes": "--pin-budget-total",
    "CacheConfig.retention_budget_bytes": "--retention-budget",
    "EngineConfig.max_model_len": "--max-model-len",
    "EngineConfig.max_batch_tokens": "--max-batch-tokens",
    "EngineConfig.max_num_seqs": "--max-num-seqs",
    "EngineConfig.max_queue": "--max-queue",
    "EngineConfig.session_think_time_s": "--session-think-time",
    "EngineConfig.dtype": "--dtype",
    "ServerConfig.port": "--port",
    "ServerConfig.max_request_bytes": "--max-request-bytes",
    "ServerConfig.max_request_tokens": "--max-request-tokens",
    "ServerConfig.max_connections": "--max-connections",
    "ServerConfig.api_key": "--api-key",
    "KvEventsConfig.endpoint": "--kv-events-endpoint",
    "KvEventsConfig.replay_endpoint": "--kv-events-replay-endpoint",
}
_FIELD_PATTERN = re.compile("|".join(re.escape(name) for name in FLAG_OF_FIELD))


def in_flag_terms(error: ConfigError) -> ConfigError:
    """The same error, naming flags instead of config fields."""
    message = _FIELD_PATTERN.sub(lambda match: FLAG_OF_FIELD[match.group(0)], str(error))
    return ConfigError(message)


def disk_tier_flags(directory: Path | None, size: int | None, default_size: int) -> int:
    """The disk tier's size in bytes (0: no disk tier) from `--disk-cache-dir` and
    `--disk-cache-size`; ConfigError, in the flags' terms, when they do not fit together or the
    filesystem cannot hold the store."""
    if directory is None:
        if size:  # 0 says "no disk tier", which is what no directory gives
            raise ConfigError(
                "--disk-cache-size needs --disk-cache-dir (the disk tier lives in a directory); "
                "add --disk-cache-dir DIR, or drop --disk-cache-size"
            )
        return 0
    size = default_size if size is None else size
    if size == 0:
        return 0
    _check_directory(directory)
    _check_free_space(directory, size)
    return size


def _check_directory(directory: Path) -> None:
    if directory.exists() and not directory.is_dir():
        raise ConfigError(f"--disk-cache-dir {directory}: exists and is not a directory")
    if not directory.exists() and not directory.parent.is_dir():
        raise ConfigError(
            f"--disk-cache-dir {directory}: its parent {directory.parent} does not exist "
            "(a mistyped path is not created); create the parent first or fix the path"
        )


def _check_free_space(directory: Path, size: int) -> None:
    """Refuse a store the filesystem cannot hold (a store file already there counts as free:
    it is reopened or replaced in place)."""
    where = directory if directory.exists() else directory.parent
    status = os.statvfs(where)
    free = status.f_bavail * status.f_frsize
    from tieredkv.cache.disk.directory import STORE_FILE  # lazy: it imports torch

    store = directory / STORE_FILE
    if store.is_file():
        free += store.stat().st_blocks * 512
    room = free - DISK_SPARE_BYTES
    if size > room:
        raise ConfigError(
            f"--disk-cache-size {size / GIB:.1f} GiB does not fit on {where}'s filesystem "
            f"({free / GIB:.1f} GiB free, {DISK_SPARE_BYTES / GIB:.0f} GiB kept spare); "
            f"pass --disk-cache-size {max(room, 0) // GIB}GiB or less"
        )
