"""Isolation: namespaces never share pages (in any tier), /v1/* needs the API key, the disk
tier's files are the owner's alone, and nothing is ever unpickled."""

from __future__ import annotations

import ast
import stat
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.reliability.conftest import AUTH
from tests.reliability.harness import (
    MODEL,
    REPO,
    FaultServer,
    cached_by_tier,
    disk_read_bytes,
    document,
)

PAGE_TOKENS = 16


def chat(server: FaultServer, content: str, headers: dict | None = None, **extra) -> httpx.Response:
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}]}
    body |= {"max_tokens": 2, "temperature": 0, **extra}
    return server.post("/v1/chat/completions", body, headers={**AUTH, **(headers or {})})


def cached(response: httpx.Response) -> dict[str, int]:
    assert response.status_code == 200, response.text
    return cached_by_tier(response.json())


def test_namespaces_never_share_pages(guarded: FaultServer) -> None:
    secret = f"Private notes of tenant A: {document(31, 60)}"
    assert sum(cached(chat(guarded, secret, cache_salt="tenant-a")).values()) == 0
    assert sum(cached(chat(guarded, secret, cache_salt="tenant-b")).values()) == 0
    again = sum(cached(chat(guarded, secret, headers={"X-Cache-Namespace": "tenant-a"})).values())
    assert again > 2 * PAGE_TOKENS  # header and field name the same namespace
    # the default namespace may share the chat template's system prompt with earlier default
    # requests (other tests), never tenant A's pages
    assert sum(cached(chat(guarded, secret)).values()) <= 2 * PAGE_TOKENS
    reads = disk_read_bytes(guarded.metrics())
    for seed in range(4):  # push tenant A's pages down to disk
        chat(guarded, f"Filler {seed}: {document(40 + seed, 60)}")
    assert sum(cached(chat(guarded, secret, cache_salt="tenant-c")).values()) == 0
    assert sum(cached(chat(guarded, secret, cache_salt="tenant-a")).values()) == again
    assert disk_read_bytes(guarded.metrics()) > reads  # tenant A's pages came back from disk


@pytest.mark.parametrize(
    ("extra", "headers"),
    [
        ({"cache_salt": "a"}, {"X-Cache-Namespace": "b"}),
        ({"cache_salt": ""}, {}),
        ({}, {"X-Cache-Namespace": ""}),
        ({"cache_salt": "x" * 257}, {}),
    ],
    ids=["both-differ", "empty-salt", "empty-header", "salt-too-long"],
)
def test_bad_namespaces_are_400(guarded: FaultServer, extra: dict, headers: dict) -> None:
    response = chat(guarded, "hello", headers, **extra)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": "Bearer RELIABILITY-SECRET"},
        {"Authorization": "Basic reliability-secret"},
        {"Authorization": "Bearer"},
    ],
    ids=["none", "wrong", "case", "basic", "empty"],
)
def test_api_key_guards_v1(guarded: FaultServer, headers: dict) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    calls = [
        ("POST", "/v1/chat/completions", body),
        ("POST", "/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 1}),
        ("GET", "/v1/models", None),
        ("POST", "/v1/cache/flush", {}),
        ("GET", "/debug/cache", None),
    ]
    for method, path, json_body in calls:
        response = httpx.request(
            method, guarded.base_url + path, json=json_body, headers=headers, timeout=30
        )
        assert response.status_code == 401, (path, response.text)
        assert set(response.json()["error"]) == {"message", "type", "param", "code"}
    assert httpx.get(guarded.base_url + "/health", timeout=30).status_code == 200
    assert httpx.get(guarded.base_url + "/metrics", timeout=30).status_code == 200
    assert httpx.get(guarded.base_url + "/v1/models", headers=AUTH, timeout=30).status_code == 200


def test_disk_files_are_owner_only(guarded: FaultServer) -> None:
    """The server runs with umask 0: the modes are set explicitly, not inherited."""
    assert guarded.root is not None
    directory = guarded.root / "kv"
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    files = sorted(directory.iterdir())
    names = {f.name for f in files}
    # the store and its lock always; the flush generations once a test of this module flushed
    assert (
        {"pages-0.tkv", "tieredkv.lock"}
        <= names
        <= {
            "pages-0.tkv",
            "tieredkv.lock",
            "generations.json",
        }
    ), names
    for path in files:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path


# Modules and calls that execute code while deserializing.
UNSAFE_MODULES = {"pickle", "cPickle", "_pickle", "marshal", "shelve", "dill", "cloudpickle"}
UNSAFE_MODULES |= {"joblib"}
UNSAFE_CALLS = {("torch", "load"), ("np", "load"), ("numpy", "load"), ("yaml", "load")}


def unsafe_uses(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.split(".")[0] in UNSAFE_MODULES]
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module.split(".")[0] in UNSAFE_MODULES:
                found.append(node.module)
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and (node.value.id, node.attr) in UNSAFE_CALLS
        ):
            found.append(f"{node.value.id}.{node.attr}")
    return [f"{path.relative_to(REPO)}: {name}" for name in found]


def test_nothing_is_unpickled(guarded: FaultServer) -> None:
    """No code-executing format in the source, and none used while serving from every tier."""
    sources = [p for d in ("tieredkv", "server", "kernels") for p in (REPO / d).rglob("*.py")]
    assert len(sources) > 50
    assert [use for path in sources for use in unsafe_uses(path)] == []
    for seed in range(4):  # traffic that reads pages back from host and disk
        chat(guarded, f"Audit {seed}: {document(50 + seed, 60)}")
    assert sum(cached(chat(guarded, f"Audit 0: {document(50, 60)}")).values()) > 0
    assert guarded.root is not None
    audit = guarded.root / "unpickled.log"
    assert not audit.exists() or audit.read_text() == ""


def test_the_unpickling_audit_sees_an_unpickle(tmp_path: Path) -> None:
    """The audit hook the guarded server runs under does catch an unpickled object."""
    log = tmp_path / "audit.log"
    code = (
        "import pickle, pathlib; from tests.reliability.fault_server import _audit_unpickling; "
        f"_audit_unpickling({str(log)!r}); pickle.loads(pickle.dumps(pathlib.Path('x')))"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=60)
    assert "pickle.find_class" in log.read_text()
