"""The Triton kernels compile for a real GPU target, even on a machine without one."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("compile_for_gpu.py")


@pytest.mark.parametrize("arch", [90])
def test_kernels_compile_to_cubin(arch):
    pytest.importorskip("triton")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    # Triton's cache is keyed by the kernel source and options: a hit means this exact source
    # compiled before, so repeat runs stay fast without proving less.
    result = subprocess.run(
        [sys.executable, str(SCRIPT), str(arch)], env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    if result.returncode and "ptxas" in result.stderr and "not found" in result.stderr:
        pytest.skip(f"no ptxas for sm_{arch} in this triton install")
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count(": ok") == 8, result.stdout
