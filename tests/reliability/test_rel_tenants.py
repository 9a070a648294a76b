"""Tenants bound to keys: a tenant key's requests live in its own namespace, a salt
subdivides it and never escapes it, its flush reaches only its namespace, and only an admin
key flushes everything, reads /debug/cache or (like every key) /openapi.json."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.reliability.harness import COMMON, MODEL, FaultServer, opening

KEYS = {
    "alice": "alice-key-0123456789abcdef",
    "bob": "bob-key-0123456789abcdef",
    "admin": "admin-key-0123456789abcdef",
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultServer]:
    root = tmp_path_factory.mktemp("tenants")
    keys_file = root / "keys"
    keys_file.write_text(
        "# key tenant role\n"
        f"{KEYS['alice']} alice tenant\n{KEYS['bob']}   bob tenant  # a comment\n"
        f"{KEYS['admin']} ops admin\n"
    )
    os.chmod(keys_file, 0o600)
    args = [*COMMON, "--api-keys-file", str(keys_file), "--debug-endpoints"]
    server = FaultServer(args, root / "server.log")
    yield server
    server.stop()


def _chat(server: FaultServer, who: str, seed: int, **extra: object) -> dict:
    headers = {"Authorization": f"Bearer {KEYS[who]}"}
    body = {"model": MODEL, "messages": opening(seed, 60), "max_tokens": 2, "temperature": 0}
    response = server.post("/v1/chat/completions", {**body, **extra}, headers=headers)
    assert response.status_code == 200, response.text
    return response.json()


def _cached(reply: dict) -> int:
    return reply["usage"]["prompt_tokens_details"]["cached_tokens"]


def _flush(server: FaultServer, who: str) -> httpx.Response:
    headers = {"Authorization": f"Bearer {KEYS[who]}"}
    return server.post("/v1/cache/flush", {}, headers=headers)


def test_tenants_never_share_pages_and_a_salt_never_escapes(server: FaultServer) -> None:
    _chat(server, "alice", seed=1)
    assert _cached(_chat(server, "alice", seed=1)) > 0  # her own repeat hits
    assert _cached(_chat(server, "bob", seed=1)) == 0  # the same prompt, another tenant
    # a salt subdivides a tenant's namespace: bob cannot reach alice's pages by naming them
    assert _cached(_chat(server, "bob", seed=1, cache_salt="alice")) == 0
    assert _cached(_chat(server, "bob", seed=1, cache_salt="default")) == 0
    body = {"model": MODEL, "messages": opening(1, 60), "max_tokens": 2}
    headers = {"X-Cache-Namespace": "alice-too", "Authorization": f"Bearer {KEYS['bob']}"}
    cached = [
        _cached(server.post("/v1/chat/completions", body, headers=headers).json()) for _ in range(2)
    ]
    assert cached[0] == 0 and cached[1] > 0  # the header subdivides too: a miss, then a hit
    assert _cached(_chat(server, "alice", seed=1, cache_salt="alice-too")) == 0


def test_a_tenant_flush_touches_only_its_namespace(server: FaultServer) -> None:
    _chat(server, "alice", seed=2)
    _chat(server, "bob", seed=2)
    _chat(server, "bob", seed=3, cache_salt="project-x")
    flushed = _flush(server, "bob")
    assert flushed.status_code == 200 and flushed.json()["flushed_pages"] > 0
    assert _cached(_chat(server, "alice", seed=2)) > 0  # alice's pages stayed
    assert _cached(_chat(server, "bob", seed=3, cache_salt="project-x")) == 0  # bob's went
    assert _flush(server, "admin").json()["flushed_pages"] > 0  # an admin flushes all
    assert _cached(_chat(server, "alice", seed=2)) == 0


def test_only_an_admin_reads_the_debug_view_and_every_route_needs_a_key(
    server: FaultServer,
) -> None:
    url = server.base_url
    tenant = {"Authorization": f"Bearer {KEYS['alice']}"}
    admin = {"Authorization": f"Bearer {KEYS['admin']}"}
    denied = httpx.get(url + "/debug/cache", headers=tenant, timeout=60)
    assert denied.status_code == 403 and denied.json()["error"]["code"] == "forbidden"
    assert httpx.get(url + "/debug/cache", headers=admin, timeout=60).json()["ok"]
    assert httpx.get(url + "/openapi.json", timeout=30).status_code == 401
    assert httpx.get(url + "/openapi.json", headers=tenant, timeout=30).json()["paths"]
    wrong = {"Authorization": "Bearer alice-key-0123456789abcdeX"}
    assert httpx.get(url + "/v1/models", headers=wrong, timeout=30).status_code == 401
    assert httpx.get(url + "/health", timeout=30).status_code == 200  # stays open


def test_the_keys_file_must_be_private(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from tieredkv.cli import main

    keys_file = tmp_path / "keys"
    keys_file.write_text(f"{KEYS['alice']} alice tenant\n")
    os.chmod(keys_file, 0o640)
    assert main(["serve", "--api-keys-file", str(keys_file)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tieredkv serve: error:") and "chmod 600" in err
    assert err.count("\n") == 1
