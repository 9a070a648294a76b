"""`make serve` as the README gives it: flags in ARGS are added to the defaults (the disk tier
stays), DISK_DIR moves the disk tier. `make -n` prints the command without running it."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def serve_command(*variables: str) -> str:
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    done = subprocess.run(
        ["make", "-n", "-s", "serve", *variables],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    # the install recipe also names `tieredkv serve` (in words) when the install stamp is stale
    return next(line for line in done.stdout.splitlines() if "bin/tieredkv serve" in line)


def test_args_add_to_the_defaults() -> None:
    command = serve_command("ARGS=--port 8001 --host 0.0.0.0")
    assert "--disk-cache-dir" in command and "/.cache/tieredkv/kv" in command
    assert command.index("--disk-cache-dir") < command.index("--port 8001")  # the last wins
    assert "--host 0.0.0.0" in command


def test_disk_dir_moves_the_disk_tier() -> None:
    command = serve_command("DISK_DIR=/mnt/nvme/kv")
    assert "--disk-cache-dir /mnt/nvme/kv" in command
