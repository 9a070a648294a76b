"""`tieredkv serve`'s flags as the frozen configs it runs with, validated before anything slow
happens; a config's error names the flag and the value the user typed."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from tieredkv.api_keys import read_api_keys_file, single_api_key
from tieredkv.cache.remote.connection import check_url
from tieredkv.cache.remote.password import password_from_env_or_file
from tieredkv.cache.remote.secret import SECRET_ENV, secret_from_env_or_file
from tieredkv.config import (
    CacheConfig,
    EngineConfig,
    KvEventsConfig,
    SchedulePolicy,
    ServerConfig,
    WritePolicy,
    parse_size,
)
from tieredkv.errors import ConfigError
from tieredkv.serve_flags import DEFAULT_DISK_CACHE, disk_tier_flags, in_flag_terms


@dataclasses.dataclass(frozen=True)
class ServeSettings:
    """Everything `serve` needs besides the model, validated before anything is loaded."""

    model: str | None
    served_model_name: str | None
    max_model_len: int | None
    server: ServerConfig
    cache: CacheConfig
    engine: EngineConfig
    pin_file: Path | None = None
    kv_events: KvEventsConfig | None = None  # None: no KV events published


def serve_settings(args: argparse.Namespace) -> ServeSettings:
    """The frozen configs of `serve`'s flags (ConfigError names the flag and the bad value)."""
    try:
        return _serve_settings(args)
    except ConfigError as error:
        raise in_flag_terms(error) from None


def _serve_settings(args: argparse.Namespace) -> ServeSettings:
    disk_dir = args.disk_cache_dir.expanduser() if args.disk_cache_dir else None
    disk_bytes = disk_tier_flags(disk_dir, args.disk_cache_size, parse_size(DEFAULT_DISK_CACHE))
    server = ServerConfig(
        host=args.host,
        port=args.port,
        served_model_name=args.served_model_name,
        api_key=single_api_key(args.api_key, args.api_key_file),
        api_keys=read_api_keys_file(args.api_keys_file) if args.api_keys_file else {},
        max_request_bytes=args.max_request_bytes,
        max_request_tokens=args.max_request_tokens,
        max_connections=args.max_connections,
        debug_endpoints=args.debug_endpoints,
    )
    if args.remote_cache_url is not None:
        check_url(args.remote_cache_url)  # before the password is read or anything logged
    cache_fields = (
        {} if args.write_policy is None else {"write_policy": WritePolicy(args.write_policy)}
    )
    cache = CacheConfig(
        page_size=args.page_size,
        device_cache_bytes=args.device_cache_size,
        host_cache_bytes=args.host_cache_size,
        workspace_bytes=args.workspace_size,
        disk_cache_dir=disk_dir,
        disk_cache_bytes=disk_bytes,
        enable_prefix_reuse=not args.no_cache,
        remote_cache_url=args.remote_cache_url,
        remote_compression=args.remote_compression,
        remote_budget_scale=args.remote_budget_scale,
        pin_budget_bytes=args.pin_budget,
        pin_budget_total_bytes=args.pin_budget_total,
        retention_budget_bytes=args.retention_budget,
        namespace_share=args.namespace_share,
        host_whole_pages=args.host_whole_pages,
        device_whole_pages=args.device_whole_pages,
        disk_whole_pages=args.disk_whole_pages,
        remote_password=(
            password_from_env_or_file(args.remote_password_file) if args.remote_cache_url else None
        ),
        remote_secret=_remote_secret(args),
        **cache_fields,
    )
    engine_fields = {} if args.max_model_len is None else {"max_model_len": args.max_model_len}
    engine = EngineConfig(
        max_batch_tokens=args.max_batch_tokens,
        max_num_seqs=args.max_num_seqs,
        max_queue=args.max_queue,
        schedule_policy=SchedulePolicy(args.schedule_policy),
        session_think_time_s=args.session_think_time,
        dtype=args.dtype,
        **engine_fields,
    )
    return ServeSettings(
        args.model,
        args.served_model_name,
        args.max_model_len,
        server,
        cache,
        engine,
        args.pin_file,
        kv_events=_kv_events(args),
    )


def _kv_events(args: argparse.Namespace) -> KvEventsConfig | None:
    if args.kv_events_endpoint is None:
        if args.kv_events_replay_endpoint is not None:
            raise ConfigError(
                "--kv-events-replay-endpoint needs --kv-events-endpoint (it replays what that "
                "socket published)"
            )
        return None
    return KvEventsConfig(
        args.kv_events_endpoint, args.kv_events_replay_endpoint, args.kv_events_topic
    )


def _remote_secret(args: argparse.Namespace) -> bytes | None:
    """The remote tier's secret: required with a remote tier, unless explicitly waived."""
    if args.remote_cache_url is None:
        return None
    secret = secret_from_env_or_file(args.remote_secret_file)
    if secret is None and not args.remote_insecure_no_secret:
        raise ConfigError(
            "--remote-cache-url needs a secret shared by the replicas: --remote-secret-file PATH "
            f"or ${SECRET_ENV} (or --remote-insecure-no-secret to trust whoever can write to Redis)"
        )
    return secret
