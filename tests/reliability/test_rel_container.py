"""Safe by default in containers: the image's entrypoint serves on every interface
only with a key (generating one, private, on the volume, and saying where), and the compose
file publishes on loopback unless the user opts in."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import httpx
import pytest
import yaml

from tests.integration.server_process import ServerProcess, free_port
from tests.model_factory import make_tiny_model_dir

REPO = Path(__file__).resolve().parents[2]


def test_the_entrypoint_never_serves_without_a_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TIEREDKV_API_KEY", raising=False)
    model = make_tiny_model_dir(tmp_path / "model")
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    port = free_port()
    env = {
        "TIEREDKV_DATA_DIR": str(data),
        "TIEREDKV_PORT": str(port),
        "TIEREDKV_DISK_CACHE_SIZE": "8MiB",
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
    }
    server = ServerProcess(
        ["--model", str(model), "--dtype", "float32"],
        tmp_path / "server.log",
        command=["sh", str(REPO / "deploy" / "entrypoint.sh")],
        env=env,
        port=port,
    )
    try:
        key_file = data / "api-key"
        assert f"generated one in {key_file}" in server.log()
        assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
        key = key_file.read_text().strip()
        assert len(key) >= 32
        models = f"{server.base_url}/v1/models"
        assert httpx.get(models, timeout=30).status_code == 401
        headers = {"Authorization": f"Bearer {key}"}
        assert httpx.get(models, headers=headers, timeout=30).status_code == 200
    finally:
        server.stop()


def test_compose_publishes_on_loopback_unless_asked() -> None:
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    for name, service in compose["services"].items():
        for mapping in service.get("ports", []):
            host = mapping.rsplit(":", 2)[0]
            assert host == "${TIEREDKV_BIND:-127.0.0.1}", (name, mapping)
    assert "TIEREDKV_API_KEY" in compose["services"]["tieredkv"]["environment"]
