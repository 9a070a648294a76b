"""Disk honesty helpers and the managed server's start-up failure path."""

from pathlib import Path

import pytest

from tieredkv.bench.disk_check import disk_read_bandwidth, drop_page_cache
from tieredkv.bench.managed import ManagedServer, ServerStartError


def test_drop_page_cache_covers_every_file(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.bin").write_bytes(b"x" * 5000)
    (tmp_path / "sub" / "b.bin").write_bytes(b"y" * 3000)
    assert drop_page_cache(tmp_path) == 8000
    assert (tmp_path / "a.bin").read_bytes() == b"x" * 5000  # contents untouched


def test_disk_bandwidth_probe_cleans_up(tmp_path: Path) -> None:
    result = disk_read_bandwidth(tmp_path, num_bytes=1)  # rounded up to one 32 MiB chunk
    assert result["bytes"] == 32 * 2**20
    assert result["bytes_per_s"] > 0
    assert result["o_direct"] in (True, False)
    assert list(tmp_path.iterdir()) == []


def test_disk_bandwidth_probe_reads_in_parallel(tmp_path: Path) -> None:
    result = disk_read_bandwidth(tmp_path, num_bytes=3 * 2**20, chunk_bytes=2**20, in_flight=2)
    assert result["bytes"] == 3 * 2**20 and result["in_flight"] == 2
    assert result["chunk_bytes"] == 2**20 and result["bytes_per_s"] > 0
    assert list(tmp_path.iterdir()) == []


def test_a_server_that_cannot_start_is_a_named_error(tmp_path: Path) -> None:
    # a device tier too small for one --max-model-len sequence is a start-up error
    args = ["--dtype", "float32", "--max-model-len", "2048", "--device-cache-size", "1MiB"]
    server = ManagedServer(args, tmp_path / "serve.log", threads=1)
    with pytest.raises(ServerStartError, match="did not start"):
        server.wait_ready(timeout_s=300)
    assert server.process.poll() is not None
    assert "device" in (tmp_path / "serve.log").read_text().lower()
