"""What a new user meets first, through the real `tieredkv serve` command line: a port in use
is one line before the model loads, and a normal start and stop print nothing that looks like a
crash (no traceback, no leak report from a library loaded at exit)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.server_process import ServerProcess
from tests.model_factory import make_tiny_model_dir

SERVE = [sys.executable, "-c", "from tieredkv.cli import main; raise SystemExit(main())", "serve"]
NOISE = ("Traceback", "leaked", "nanobind")


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model_dir(tmp_path_factory.mktemp("model"))


def test_a_port_in_use_is_one_line_before_the_model_loads(tiny_model: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [*SERVE, "--model", str(tiny_model), "--dtype", "float32", "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert done.returncode == 1
    assert "loading" not in done.stdout  # refused before the model was read
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("tieredkv serve: error: --host 127.0.0.1 --port")
    assert f"--port {port}" in lines[0] and "in use" in lines[0]


def test_a_normal_start_and_stop_print_no_noise(tiny_model: Path, tmp_path: Path) -> None:
    """bf16 on a CPU: torch's compiler fuses the pointwise ops, and imports Triton to do so."""
    args = ["--model", str(tiny_model), "--dtype", "bfloat16", "--device-cache-size", "16MiB"]
    args += ["--host-cache-size", "16MiB"]
    server = ServerProcess(args, tmp_path / "serve.log")
    assert server.stop() < 10.0
    assert server.process.returncode == 0
    log = server.log_path.read_text(errors="replace")
    assert "serving" in log and "KV:" in log  # it ran, and summarised its tiers
    for word in NOISE:
        assert word not in log, log[-3000:]
