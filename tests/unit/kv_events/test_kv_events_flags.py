"""`serve`'s KV events flags: their config, and errors that name the flag."""

from __future__ import annotations

import socket

import pytest

from tieredkv.cli_parser import build_parser
from tieredkv.config import KvEventsConfig
from tieredkv.errors import ConfigError
from tieredkv.kv_events.publisher import KvEventPublisher
from tieredkv.serve_settings import ServeSettings, serve_settings


def settings_of(*flags: str) -> ServeSettings:
    return serve_settings(build_parser().parse_args(["serve", *flags]))


def test_no_endpoint_publishes_nothing() -> None:
    assert settings_of().kv_events is None


def test_the_three_flags_make_the_config() -> None:
    flags = ["--kv-events-endpoint", "tcp://*:5557", "--kv-events-replay-endpoint", "tcp://*:5558"]
    config = settings_of(*flags, "--kv-events-topic", "replica-1").kv_events
    assert config == KvEventsConfig("tcp://*:5557", "tcp://*:5558", "replica-1")


def test_a_replay_endpoint_needs_the_events_endpoint() -> None:
    with pytest.raises(ConfigError, match="--kv-events-replay-endpoint needs"):
        settings_of("--kv-events-replay-endpoint", "tcp://*:5558")


@pytest.mark.parametrize("flag", ["--kv-events-endpoint", "--kv-events-replay-endpoint"])
def test_an_endpoint_without_a_zmq_scheme_is_refused_by_its_flag(flag: str) -> None:
    flags = {"--kv-events-endpoint": "tcp://*:5557", flag: "localhost:5557"}
    with pytest.raises(ConfigError, match=f"{flag} must start with tcp://"):
        settings_of(*[part for pair in flags.items() for part in pair])


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_an_endpoint_in_use_is_a_config_error() -> None:
    config = KvEventsConfig(f"tcp://*:{free_port()}")
    first = KvEventPublisher(config, page_size=16)
    try:
        with pytest.raises(ConfigError, match="KV events endpoint tcp://"):
            KvEventPublisher(config, page_size=16)
    finally:
        first.close()
