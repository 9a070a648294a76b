"""The weight and KV dtype: `--dtype auto|bfloat16|float32`, decided once at start-up."""

from __future__ import annotations

from pathlib import Path

import torch

from tieredkv.errors import ConfigError

_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
# A CPU computes bf16 matmuls at full speed only with these instructions; without them bf16 is
# emulated and slower than fp32, so "auto" keeps fp32 there.
_BF16_CPU_FLAGS = frozenset({"amx_bf16", "avx512_bf16"})
_CPUINFO = Path("/proc/cpuinfo")


def cpu_flags(cpuinfo: Path = _CPUINFO) -> frozenset[str]:
    """The CPU feature flags listed in /proc/cpuinfo; empty where the file does not exist."""
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return frozenset()
    flags: set[str] = set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            flags.update(value.split())
    return frozenset(flags)


def resolve_dtype(name: str, device: torch.device, cpuinfo: Path = _CPUINFO) -> torch.dtype:
    """Map `--dtype` to a torch dtype.

    "auto" is bf16 on CUDA, or on a CPU whose flags include amx_bf16 or avx512_bf16; fp32
    otherwise. "bfloat16" and "float32" are taken as given. Anything else is a ConfigError.
    """
    if name in _DTYPES:
        return _DTYPES[name]
    if name != "auto":
        raise ConfigError(f"dtype must be auto|bfloat16|float32, got {name!r}")
    if torch.device(device).type == "cuda":
        return torch.bfloat16
    if torch.device(device).type == "cpu" and cpu_flags(cpuinfo) & _BF16_CPU_FLAGS:
        return torch.bfloat16
    return torch.float32


def bf16_is_emulated(device: torch.device, flags: frozenset[str] | None = None) -> bool:
    """Whether bf16 arithmetic on `device` is emulated: a CPU with neither AMX-BF16 nor
    AVX512-BF16. There oneDNN's bf16 matmuls convert in software and ran 2-5x slower than fp32
    ones on the same values (an AVX512 Xeon without bf16, from 2 rows up)."""
    if torch.device(device).type != "cpu":
        return False
    return not (cpu_flags() if flags is None else flags) & _BF16_CPU_FLAGS
