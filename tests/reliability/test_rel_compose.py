"""The compose files: Docker Compose itself accepts them (`config -q`; skipped
where no compose is installed), and the replicas file wires what the README promises: two
replicas on one Redis remote tier, its password from a secret, Redis bounded by allkeys-lru,
the cache-aware router over both replicas, Prometheus scraping both, loopback by default."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
REPLICAS_FILE = REPO / "deploy" / "compose.replicas.yml"
COMPOSE_FILES = [REPO / "docker-compose.yml", REPLICAS_FILE]
REPLICAS = ("replica1", "replica2")


def compose_command() -> list[str]:
    """`docker compose` (v2) or `docker-compose` (v1), whichever runs; else skip."""
    docker = shutil.which("docker")
    if (
        docker
        and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0
    ):
        return [docker, "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    pytest.skip("neither `docker compose` nor `docker-compose` is installed")


@pytest.mark.parametrize("path", COMPOSE_FILES, ids=lambda path: path.name)
def test_docker_compose_accepts_the_file(path: Path) -> None:
    env = {**os.environ, "TIEREDKV_API_KEY": "k" * 32}
    result = subprocess.run(
        [*compose_command(), "-f", str(path), "config", "-q"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr


def test_compose_refuses_replicas_without_a_shared_key() -> None:
    env = {key: value for key, value in os.environ.items() if key != "TIEREDKV_API_KEY"}
    result = subprocess.run(
        [*compose_command(), "-f", str(REPLICAS_FILE), "config", "-q"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert result.returncode != 0 and "TIEREDKV_API_KEY" in result.stderr


def test_replicas_share_redis_with_the_password_from_a_secret() -> None:
    services = yaml.safe_load(REPLICAS_FILE.read_text())["services"]
    for name in REPLICAS:
        replica = services[name]
        assert replica["command"] == ["--remote-cache-url", "redis://redis:6379/0"]
        assert "TIEREDKV_REDIS_PASSWORD_FILE=/run/secrets/redis_password" in replica["environment"]
        assert "TIEREDKV_REMOTE_SECRET_FILE=/run/secrets/remote_secret" in replica["environment"]
        assert replica["secrets"] == ["redis_password", "remote_secret"]
        assert "ports" not in replica
    assert services["redis"]["secrets"] == ["redis_password"] and "ports" not in services["redis"]
    entrypoint = (REPO / "deploy" / "redis-entrypoint.sh").read_text()
    assert "maxmemory-policy allkeys-lru" in entrypoint and "requirepass" in entrypoint
    assert "password" not in " ".join(services["redis"].get("command", []))


def test_router_is_cache_aware_over_both_replicas_and_prometheus_scrapes_both() -> None:
    services = yaml.safe_load(REPLICAS_FILE.read_text())["services"]
    command = services["router"]["command"]
    assert "--policy=cache_aware" in command
    workers = command[command.index("--worker-urls") + 1 :][:2]
    assert workers == [f"http://{name}:8000" for name in REPLICAS]
    scrape = yaml.safe_load((REPO / "deploy" / "prometheus.replicas.yml").read_text())
    (job,) = scrape["scrape_configs"]
    assert job["static_configs"][0]["targets"] == [f"{name}:8000" for name in REPLICAS]
    for name, service in services.items():
        for mapping in service.get("ports", []):
            assert mapping.rsplit(":", 2)[0] == "${TIEREDKV_BIND:-127.0.0.1}", (name, mapping)


BASE_ARGS = {
    "PYTHON_IMAGE": "${TIEREDKV_PYTHON_IMAGE:-python:3.11-slim}",
    "DEBIAN_IMAGE": "${TIEREDKV_DEBIAN_IMAGE:-debian:bookworm-slim}",
}


@pytest.mark.parametrize("path", COMPOSE_FILES, ids=lambda path: path.name)
def test_every_image_builds_on_a_base_the_environment_can_name(path: Path) -> None:
    """Where no registry is reachable, deploy/base/build.sh makes the two bases and the
    TIEREDKV_*_IMAGE variables point every build at them: no service pulls an image."""
    for name, service in yaml.safe_load(path.read_text())["services"].items():
        assert "image" not in service, name
        build = service["build"]
        dockerfile = path.parent / build["context"] / build.get("dockerfile", "Dockerfile")
        (arg,) = build["args"]
        assert build["args"][arg] == BASE_ARGS[arg], name
        lines = dockerfile.read_text().splitlines()
        assert f"ARG {arg}=" in "\n".join(lines) and f"FROM ${{{arg}}}" in lines, dockerfile


def test_the_offline_python_base_installs_torchs_cpu_build() -> None:
    base = REPO / "deploy" / "base"
    dockerfile = (base / "python.Dockerfile").read_text()
    assert "FROM ${DEBIAN_IMAGE}" in dockerfile and '"torch==2.13.0+cpu"' in dockerfile
    script = (base / "build.sh").read_text()
    assert "debootstrap --variant=minbase bookworm" in script and "docker import" in script
    # the tieredkv image's pinned torch is then already satisfied: nothing more is fetched
    assert "torch==2.13.0 " in (REPO / "Dockerfile").read_text()
