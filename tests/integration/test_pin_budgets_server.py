"""Pins bounded through a real `tieredkv serve` with tenant keys (a tiny random Llama, fp32):
one tenant's salts share its budget, all pins share a total, only an admin lists and removes
any namespace's pins, pins.json is private, and a tenant whose key is gone loses its saved
pins at the next start."""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path

import httpx
import pytest

from tests.integration.server_process import ServerProcess
from tests.model_factory import make_tiny_model_dir

KEYS = {
    "acme": "acme-key-0123456789abcdef",
    "bob": "bob-key-0123456789abcdef",
    "ops": "ops-admin-key-0123456789abcdef",
}
ROLES = {"acme": "tenant", "bob": "tenant", "ops": "admin"}
# fp32 pages of 16 tokens: 2 layers x (K, V) x 2 KV heads x 32 dims x 16 tokens x 4 B = 8 KiB;
# each tenant may pin 10 pages, all pins together 16
PAGE_BYTES = 8192
BUDGETS = ["--pin-budget", f"{10 * PAGE_BYTES}", "--pin-budget-total", f"{16 * PAGE_BYTES}"]
HTTP = httpx.Client(timeout=120.0)


def prompt(seed: int) -> list[int]:
    """64 token ids: four full pages."""
    return [3 + (seed * 31 + i * 7) % 300 for i in range(64)]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model_dir(tmp_path_factory.mktemp("model"))


def write_keys(path: Path, who: list[str]) -> Path:
    path.write_text("".join(f"{KEYS[name]} {name} {ROLES[name]}\n" for name in who))
    os.chmod(path, 0o600)
    return path


def start(model: Path, root: Path, who: list[str], log_name: str) -> ServerProcess:
    keys = write_keys(root / f"keys-{log_name}", who)
    args = ["--model", str(model), "--dtype", "float32", "--max-num-seqs", "4"]
    args += ["--device-cache-size", "1MiB", "--host-cache-size", "512KiB", *BUDGETS]
    args += ["--disk-cache-dir", str(root / "kv"), "--disk-cache-size", "8MiB"]
    return ServerProcess([*args, "--api-keys-file", str(keys)], root / f"{log_name}.log")


def pin(server: ServerProcess, who: str, seed: int, salt: str | None = None) -> httpx.Response:
    body: dict = {"prompt": prompt(seed)}
    if salt is not None:
        body["cache_salt"] = salt
    headers = {"Authorization": f"Bearer {KEYS[who]}"}
    return HTTP.post(server.base_url + "/v1/cache/pin", json=body, headers=headers)


def listing(server: ServerProcess, who: str = "ops", **params: str) -> httpx.Response:
    headers = {"Authorization": f"Bearer {KEYS[who]}"}
    return HTTP.get(server.base_url + "/v1/cache/pins", params=params, headers=headers)


def remove(server: ServerProcess, pin_id: str, who: str = "ops") -> httpx.Response:
    headers = {"Authorization": f"Bearer {KEYS[who]}"}
    return HTTP.delete(server.base_url + f"/v1/cache/pins/{pin_id}", headers=headers)


def wait_until_held(server: ServerProcess, count: int) -> list[dict]:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        pins = listing(server).json()["data"]
        if len(pins) == count and all(entry["held"] for entry in pins):
            return pins
        time.sleep(0.5)  # test code: the server pins again in the background at start
    raise AssertionError(f"{count} held pins not seen within 120 s: {pins}")


def test_pins_are_bounded_per_tenant_and_in_all_and_an_admin_removes_any(
    tiny_model: Path, tmp_path: Path
) -> None:
    root = tmp_path
    server = start(tiny_model, root, ["acme", "bob", "ops"], "first")
    try:
        salts = [f"salt-{i}" for i in range(6)]
        replies = [pin(server, "acme", seed=i, salt=salt) for i, salt in enumerate(salts)]
        accepted = [reply.json() for reply in replies if reply.status_code == 200]
        refused = [reply.json()["error"]["code"] for reply in replies if reply.status_code != 200]
        assert [body["pinned_pages"] for body in accepted] == [4, 4]
        assert refused == ["pin_budget_exceeded"] * 4  # six salts, one tenant's 10 pages
        assert accepted[-1]["owner_pinned_pages"] == 8 and accepted[-1]["budget_pages"] == 10
        # another tenant still pins: its own budget, within the total
        assert pin(server, "bob", seed=10).status_code == 200
        assert pin(server, "bob", seed=11, salt="b").status_code == 200
        full = pin(server, "ops", seed=20)  # 16 of 16 pinned in all
        assert full.status_code == 400, full.text
        assert full.json()["error"]["code"] == "pin_total_budget_exceeded"
        # only an admin sees every namespace's pins, and nothing of their prompts
        assert listing(server, "acme").status_code == 403
        everything = listing(server).json()
        assert everything["total_pinned_pages"] == 16 and everything["total_budget_pages"] == 16
        where = {(entry["tenant"], entry["cache_salt"]) for entry in everything["data"]}
        assert where == {("acme", "salt-0"), ("acme", "salt-1"), ("bob", None), ("bob", "b")}
        assert all("token_ids" not in entry for entry in everything["data"])
        acme = listing(server, tenant="acme").json()["data"]
        assert len(acme) == 2
        assert remove(server, acme[0]["id"], who="acme").status_code == 403
        for entry in acme:
            assert remove(server, entry["id"]).json()["unpinned"] is True
        gone = remove(server, acme[0]["id"])
        assert gone.status_code == 404 and gone.json()["error"]["code"] == "pin_not_found"
        assert listing(server, tenant="acme").json()["data"] == []
        assert pin(server, "ops", seed=20).status_code == 200  # room again in all
        assert pin(server, "acme", seed=30, salt="again").status_code == 200
        pins_file = root / "kv" / "pins.json"
        assert stat.S_IMODE(pins_file.stat().st_mode) == 0o600
        assert len(json.loads(pins_file.read_text())) == 4
    finally:
        server.stop()
    # acme's key is gone: its saved pin is dropped at start and logged; the others come back
    restarted = start(tiny_model, root, ["bob", "ops"], "second")
    try:
        held = wait_until_held(restarted, 3)
        assert sorted(entry["tenant"] for entry in held) == ["bob", "bob", "ops"]
        log = restarted.log_path.read_text()
        assert "dropped 1 saved pins of tenant 'acme': no API key names it" in log
        pins_file = root / "kv" / "pins.json"
        assert "acme" not in pins_file.read_text()
        assert stat.S_IMODE(pins_file.stat().st_mode) == 0o600
    finally:
        restarted.stop()
