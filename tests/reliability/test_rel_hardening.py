"""Hardening (issue #14): what a careless operator or an attacker tries against a running or
starting server, and what it gets: a clear refusal, never a traceback or a silent hole."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.model_factory import make_tiny_model_dir
from tieredkv.cli import main


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model_dir(tmp_path_factory.mktemp("model"))


def _serve_error(capsys: pytest.CaptureFixture[str], model: Path, *flags: str) -> str:
    assert main(["serve", "--model", str(model), "--dtype", "float32", *flags]) == 1
    err = capsys.readouterr().err
    assert err.startswith("tieredkv serve: error:") and "Traceback" not in err
    assert err.count("\n") == 1, err  # one line
    return err


def test_a_world_writable_disk_directory_is_a_one_line_start_up_error(
    capsys: pytest.CaptureFixture[str], tiny_model: Path, tmp_path: Path
) -> None:
    directory = tmp_path / "kv"
    directory.mkdir()
    os.chmod(directory, 0o777)
    err = _serve_error(
        capsys, tiny_model, "--disk-cache-dir", str(directory), "--disk-cache-size", "1M"
    )
    assert "group- or world-writable" in err and str(directory) in err


def test_a_symlinked_store_file_is_a_one_line_start_up_error(
    capsys: pytest.CaptureFixture[str], tiny_model: Path, tmp_path: Path
) -> None:
    directory = tmp_path / "kv"
    directory.mkdir(mode=0o700)
    (directory / "pages-0.tkv").symlink_to(tmp_path / "elsewhere")
    err = _serve_error(
        capsys, tiny_model, "--disk-cache-dir", str(directory), "--disk-cache-size", "1M"
    )
    assert "pages-0.tkv" in err
    assert not (tmp_path / "elsewhere").exists()
