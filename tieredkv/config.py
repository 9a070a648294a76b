"""Frozen configuration dataclasses, validated on construction.

Every error names the field and the value. Derived values are properties, never stored twice.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field
from pathlib import Path

from tieredkv.errors import ConfigError

_SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE_RE = re.compile(r"^\s*(\d+)\s*([KMGT]?)(i?B)?\s*$", re.IGNORECASE)


def parse_size(text: str | int) -> int:
    """Parse a byte size: an integer with an optional binary unit (KiB, MiB, GiB, TiB, or K, M,
    G, T with the same meaning), or none (bytes)."""
    if isinstance(text, int):
        if text < 0:
            raise ConfigError(f"size must be >= 0, got {text}")
        return text
    match = _SIZE_RE.match(text)
    if match is None or (match.group(3) and match.group(3).lower() == "b" and match.group(2)):
        # "10KB" is ambiguous (decimal or binary); we accept only the binary spellings.
        raise ConfigError(f"invalid size {text!r}: use an integer with K/M/G/T or KiB/MiB/GiB/TiB")
    return int(match.group(1)) * _SIZE_UNITS[match.group(2).upper()]


class WritePolicy(enum.Enum):
    WRITE_BACK = "write_back"
    WRITE_THROUGH = "write_through"


class SchedulePolicy(enum.Enum):
    LPM = "lpm"  # longest prefix match first, weighted by tier, with aging
    FCFS = "fcfs"


def _check_power_of_two(name: str, value: int) -> None:
    if value <= 0 or value & (value - 1):
        raise ConfigError(f"{name} must be a power of two, got {value}")


@dataclass(frozen=True)
class CacheConfig:
    """Sizes and policies of the three KV tiers. Capacities are in bytes; 0 disables host/disk."""

    page_size: int = 16
    device_cache_bytes: int = 1 << 30
    host_cache_bytes: int = 2 << 30
    disk_cache_dir: Path | None = None
    disk_cache_bytes: int = 0
    # the benchmark's choice: write-through at page 16 gives the lowest reuse-round TTFT of the
    # write-policy x page-size grid (benchmarks/policy_grid.py): a page leaving the device
    # already has its lower copy, so eviction costs nothing on a request's path
    write_policy: WritePolicy = WritePolicy.WRITE_THROUGH
    enable_prefix_reuse: bool = True  # False is `--no-cache`: the recompute baseline
    # the remote tier: a Redis (or Redis Cluster node) URL without a password, the codec of its
    # values, and the password (from $TIEREDKV_REDIS_PASSWORD or a file, never a flag's value)
    remote_cache_url: str | None = None
    remote_compression: str = "none"
    remote_password: str | None = field(default=None, repr=False)
    # the deployment secret remote pages are named and sealed with (from $TIEREDKV_REMOTE_SECRET
    # or a file; None: unauthenticated, which `serve` allows only with
    # --remote-insecure-no-secret)
    remote_secret: bytes | None = field(default=None, repr=False)
    # the remote tier's lookup and fetch budgets times this (`RemoteTimeouts`: 20 ms a lookup,
    # 50 ms + 5 ms/MiB a fetch): past its budget a call is a miss and the tier turns degraded
    remote_budget_scale: float = 1.0
    # pinned prefixes: pages each tenant (all its namespaces together; without keys, each
    # namespace) may pin on host (None: a quarter of the host tier), and all pins together
    # (None: half the host tier, or pin_budget_bytes when larger)
    pin_budget_bytes: int | None = None
    pin_budget_total_bytes: int | None = None
    # retained prefixes ("24h"): pages held on the lowest local tier, shared equally among the
    # namespaces holding some (None: a quarter of the disk tier, or of host without one)
    retention_budget_bytes: int | None = None
    # fair tenants: the fraction of the device and host tiers each namespace may hold before
    # its pages leave first when the tier makes room (None: an equal part among the namespaces
    # holding pages there; 1.0: plain LRU across namespaces)
    namespace_share: float | None = None
    # models with sliding-window layers: every host page keeps all its layers (by default a page
    # keeps its sliding layers only where a next turn's window reads them, see
    # docs/architecture.md)
    host_whole_pages: bool = False
    # a model with sliding-window layers: every device page keeps all its layers (by default a
    # page's sliding layers are freed once no window reads them, see docs/architecture.md)
    device_whole_pages: bool = False
    # a model with sliding-window layers: every disk record holds a whole page (by default a
    # page's sliding layers are written only where a next turn's window reads them)
    disk_whole_pages: bool = False
    # the CPU attention's workspaces, carved out of device_cache_bytes (None: what the running
    # sequences can need, see tieredkv.model.workspace_budget)
    workspace_bytes: int | None = None

    def __post_init__(self) -> None:
        _check_power_of_two("CacheConfig.page_size", self.page_size)
        if self.workspace_bytes is not None and self.workspace_bytes < 0:
            raise ConfigError(
                f"CacheConfig.workspace_bytes must be >= 0, got {self.workspace_bytes}"
            )
        if not self.remote_budget_scale > 0:
            raise ConfigError(
                f"CacheConfig.remote_budget_scale must be > 0, got {self.remote_budget_scale}"
            )
        share = self.namespace_share
        if share is not None and not 0 < share <= 1:
            raise ConfigError(f"CacheConfig.namespace_share must be in (0, 1], got {share}")
        for name in ("pin_budget_bytes", "pin_budget_total_bytes"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ConfigError(f"CacheConfig.{name} must be >= 0, got {value}")
        budget = self.retention_budget_bytes
        if budget is not None and budget < 0:
            raise ConfigError(f"CacheConfig.retention_budget_bytes must be >= 0, got {budget}")
        for name in ("device_cache_bytes", "host_cache_bytes", "disk_cache_bytes"):
            if getattr(self, name) < 0:
                raise ConfigError(f"CacheConfig.{name} must be >= 0, got {getattr(self, name)}")
        if self.device_cache_bytes == 0:
            raise ConfigError("CacheConfig.device_cache_bytes must be > 0")

    @property
    def host_enabled(self) -> bool:
        return self.host_cache_bytes > 0

    @property
    def disk_enabled(self) -> bool:
        return self.disk_cache_dir is not None and self.disk_cache_bytes > 0

    @property
    def remote_enabled(self) -> bool:
        return self.remote_cache_url is not None


@dataclass(frozen=True)
class EngineConfig:
    """Limits of the engine's step loop."""

    max_model_len: int = 8192
    max_batch_tokens: int = 2048  # tokens forwarded per step (prefill chunks + decodes)
    # a named conversation's pages stay on host this long after each turn (0: off)
    session_think_time_s: float = 60.0
    # sequences running or promoting at once: enough that decoding requests leave the step's
    # prefill budget to waiting ones under load (the device room bounds their prompts' pages)
    max_num_seqs: int = 64
    max_queue: int = 256
    schedule_policy: SchedulePolicy = SchedulePolicy.LPM
    dtype: str = "auto"  # auto | bfloat16 | float32

    def __post_init__(self) -> None:
        for name in ("max_model_len", "max_batch_tokens", "max_num_seqs", "max_queue"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ConfigError(f"EngineConfig.{name} must be a positive int, got {value!r}")
        if not self.session_think_time_s >= 0:
            message = f"must be >= 0, got {self.session_think_time_s!r}"
            raise ConfigError(f"EngineConfig.session_think_time_s {message}")
        if self.dtype not in ("auto", "bfloat16", "float32"):
            raise ConfigError(
                f"EngineConfig.dtype must be auto|bfloat16|float32, got {self.dtype!r}"
            )


@dataclass(frozen=True)
class KeyGrant:
    """What an API key may do. A key with a tenant serves requests in that tenant's namespace
    only; an admin key also flushes every namespace and reads the debug endpoints."""

    tenant: str | None
    admin: bool


@dataclass(frozen=True)
class ServerConfig:
    """The HTTP front end. `api_key` is one admin key without a tenant; `api_keys` maps keys
    to their grants (`--api-keys-file`). With neither, every request passes, as an admin."""

    host: str = "127.0.0.1"
    port: int = 8000
    served_model_name: str | None = None
    api_key: str | None = None
    api_keys: dict[str, KeyGrant] = field(default_factory=dict)
    max_request_bytes: int = 1 << 20
    # tokens one request may generate over all its sequences: max(n, best_of) x max_tokens
    max_request_tokens: int = 1 << 16
    debug_endpoints: bool = False
    max_connections: int = 512  # open connections; one more is answered 503 and closed
    header_timeout_s: float = 10.0  # a request's headers, from its first byte
    body_timeout_s: float = 10.0  # a request's body, from its headers
    stall_timeout_s: float = 30.0  # a response whose reader takes nothing this long is dropped

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"ServerConfig.port must be in [0, 65535], got {self.port}")
        if self.max_request_bytes <= 0:
            raise ConfigError(
                f"ServerConfig.max_request_bytes must be > 0, got {self.max_request_bytes}"
            )
        if self.max_request_tokens <= 0:
            raise ConfigError(
                f"ServerConfig.max_request_tokens must be > 0, got {self.max_request_tokens}"
            )
        if self.max_connections <= 0:
            raise ConfigError(
                f"ServerConfig.max_connections must be > 0, got {self.max_connections}"
            )
        if self.api_key is not None and not self.api_key:
            raise ConfigError("ServerConfig.api_key must not be empty")
        if self.api_key is not None and self.api_key in self.api_keys:
            raise ConfigError("ServerConfig.api_key is also in api_keys")
        for name in ("header_timeout_s", "body_timeout_s", "stall_timeout_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"ServerConfig.{name} must be > 0, got {getattr(self, name)}")

    @property
    def grants(self) -> dict[str, KeyGrant]:
        """Every accepted key and its grant (empty: no key is required)."""
        single = {} if self.api_key is None else {self.api_key: KeyGrant(None, admin=True)}
        return {**self.api_keys, **single}


KV_EVENTS_SCHEMES = ("tcp://", "ipc://", "inproc://")


@dataclass(frozen=True)
class KvEventsConfig:
    """The KV events publisher (`tieredkv.kv_events`): a ZMQ PUB socket at `endpoint` (bound
    when its host is a wildcard, `*` or `::`, or it is ipc/inproc; else connected), a ROUTER
    answering replays at `replay_endpoint` (bound; None: no replay), messages under `topic`. At most
    `max_queue_events` events wait for the publisher thread (more are dropped and counted), the
    last `buffer_batches` batches are kept for replay, and up to `hwm` messages wait per
    subscriber in ZMQ (a slower one loses messages, which a replay recovers)."""

    endpoint: str
    replay_endpoint: str | None = None
    topic: str = ""
    max_queue_events: int = 100_000
    buffer_batches: int = 10_000
    hwm: int = 100_000
    flush_interval_s: float = 0.01  # how long an event waits at most to go out in a batch

    def __post_init__(self) -> None:
        for name in ("endpoint", "replay_endpoint"):
            value = getattr(self, name)
            if value is not None and not value.startswith(KV_EVENTS_SCHEMES):
                raise ConfigError(
                    f"KvEventsConfig.{name} must start with tcp://, ipc:// or inproc://, "
                    f"got {value!r}"
                )
        for name in ("max_queue_events", "buffer_batches", "hwm"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"KvEventsConfig.{name} must be > 0, got {getattr(self, name)}")
        if not self.flush_interval_s > 0:
            raise ConfigError(
                f"KvEventsConfig.flush_interval_s must be > 0, got {self.flush_interval_s}"
            )
