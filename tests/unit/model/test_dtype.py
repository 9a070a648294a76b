"""`--dtype auto` picks bf16 only where bf16 is fast."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tieredkv.errors import ConfigError
from tieredkv.model.dtype import bf16_is_emulated, cpu_flags, resolve_dtype

CPU = torch.device("cpu")


def _cpuinfo(tmp_path: Path, flags: str) -> Path:
    path = tmp_path / "cpuinfo"
    path.write_text(f"processor\t: 0\nflags\t\t: {flags}\n\nprocessor\t: 1\nflags\t\t: {flags}\n")
    return path


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ("fpu sse avx2 avx512f", torch.float32),
        ("fpu avx512f avx512_bf16", torch.bfloat16),
        ("fpu amx_tile amx_bf16", torch.bfloat16),
    ],
)
def test_auto_on_cpu_follows_the_flags(tmp_path: Path, flags: str, expected: torch.dtype) -> None:
    assert resolve_dtype("auto", CPU, cpuinfo=_cpuinfo(tmp_path, flags)) == expected


def test_auto_without_cpuinfo_is_fp32(tmp_path: Path) -> None:
    assert cpu_flags(tmp_path / "absent") == frozenset()
    assert resolve_dtype("auto", CPU, cpuinfo=tmp_path / "absent") == torch.float32


def test_auto_on_cuda_is_bf16(tmp_path: Path) -> None:
    no_flags = _cpuinfo(tmp_path, "fpu")
    assert resolve_dtype("auto", torch.device("cuda"), cpuinfo=no_flags) == torch.bfloat16


def test_explicit_names_and_errors() -> None:
    assert resolve_dtype("bfloat16", CPU) == torch.bfloat16
    assert resolve_dtype("float32", torch.device("cuda")) == torch.float32
    with pytest.raises(ConfigError, match=r"got 'float16'"):
        resolve_dtype("float16", CPU)


def test_bf16_is_emulated_on_a_cpu_with_neither_bf16_instruction() -> None:
    assert bf16_is_emulated(CPU, frozenset({"avx2", "avx512f", "avx512_vnni"}))
    assert not bf16_is_emulated(CPU, frozenset({"avx512f", "avx512_bf16"}))
    assert not bf16_is_emulated(CPU, frozenset({"amx_bf16"}))
    assert not bf16_is_emulated(torch.device("cuda"), frozenset())
