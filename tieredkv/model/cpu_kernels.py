"""bf16 kernels in C (`cpu_kernels.c`) for a CPU without AMX: decode attention, RMSNorm, the
prefill attention's softmax and the few-row products of a decode step's linear layers.

Without AMX, most of a bf16 decode step in torch goes to many small bf16 matmuls (a kv head's
three queries against its keys: oneDNN runs that shape at a few GB/s) and to RMSNorm, which
torch runs as eight ops on a 576-wide row. `decode_attention` stores every
decode's new K/V and attends them all in one call a layer (sequences x kv heads x key chunks
in parallel, fp32 inside); `rms_norm` is one pass; `softmax_` replaces torch's bf16 softmax
between the prefill attention's two matmuls.

The library is built with gcc the first time it is needed on a machine (`-march=native`, so
the build is keyed by the source, the flags, the compiler and the CPU's flags) into
`cache_root()/kernels`, and loaded with ctypes. OpenMP is linked by soname, so the process
shares the runtime torch loaded (or Intel OpenMP when `tieredkv serve` preloads it). Where
gcc is missing or the build fails, `load_cpu_kernels` returns None and callers use torch.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import torch

from tieredkv.model.default_model import cache_root
from tieredkv.model.dtype import cpu_flags

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("cpu_kernels.c")
FLAGS = ("-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-std=c11", "-shared", "-fPIC")
SEQ_FIELDS = 6  # the per-sequence table's columns, as `cpu_kernels.c` numbers them
FEW_ROWS = 8  # the most rows `linear_few_rows` multiplies (FEW_ROWS in `cpu_kernels.c`)

_i64, _f32, _ptr = ctypes.c_int64, ctypes.c_float, ctypes.c_void_p


class CpuKernels:
    """The loaded library's entry points, on torch tensors."""

    def __init__(self, library: ctypes.CDLL) -> None:
        self._attention = library.tkv_decode_attention
        self._attention.restype = ctypes.c_int
        self._attention.argtypes = [_i64, _ptr, _i64, _ptr, _i64, _i64, _ptr, _i64, _ptr, _i64]
        self._attention.argtypes += [_i64, _i64, _i64, _f32, _i64, _ptr]
        self._rms_norm = library.tkv_rms_norm
        self._rms_norm.restype = None
        self._rms_norm.argtypes = [_i64, _i64, _ptr, _i64, _ptr, _f32, _ptr]
        self._rope = library.tkv_rope
        self._rope.restype = None
        self._rope.argtypes = [_i64, _i64, _i64, _ptr, _i64, _i64, _ptr, _ptr, _i64, _ptr]
        self._silu_and_mul = library.tkv_silu_and_mul
        self._silu_and_mul.restype = None
        self._silu_and_mul.argtypes = [_i64, _i64, _ptr, _i64, _ptr]
        self._softmax = library.tkv_softmax
        self._softmax.restype = ctypes.c_int
        self._softmax.argtypes = [_i64, _i64, _ptr, _i64]
        self._linear = library.tkv_linear_few_rows
        self._linear.restype = ctypes.c_int
        self._linear.argtypes = [_i64, _i64, _i64, _ptr, _i64, _ptr, _ptr, _ptr, _ptr]
        self._paired = library.tkv_linear_paired
        self._paired.restype = ctypes.c_int
        self._paired.argtypes = [_i64, _i64, _i64, _ptr, _i64, _ptr, _ptr, _ptr, _i64, _ptr]

    def decode_attention(
        self,
        table: np.ndarray,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        out: torch.Tensor,
        window: int | None = None,
        scale: float | None = None,
    ) -> None:
        """Store the new K/V of each sequence in `table` (see `decode_table`) and attend its
        query rows: q (T, heads, d) and k/v (T, kv_heads, d) with unit strides inside a head,
        out (T, heads, d) contiguous; only the table's rows of `out` are written. All bf16.
        `window`: a sliding layer's, the last `window` keys only (None: all); `scale`: the
        scores' (None: 1/sqrt(d))."""
        heads, head_dim = q.shape[1], q.shape[2]
        assert q.dtype == k.dtype == v.dtype == out.dtype == torch.bfloat16
        assert q.stride(2) == k.stride(2) == v.stride(2) == 1
        assert k.stride(1) == v.stride(1) == head_dim and k.shape == v.shape
        assert out.is_contiguous() and out.shape == q.shape
        status = self._attention(
            len(table),
            table.ctypes.data,
            layer,
            q.data_ptr(),
            q.stride(0),
            q.stride(1),
            k.data_ptr(),
            k.stride(0),
            v.data_ptr(),
            v.stride(0),
            heads,
            k.shape[1],
            head_dim,
            head_dim**-0.5 if scale is None else scale,
            window or 0,
            out.data_ptr(),
        )
        if status:
            raise ValueError(f"decode attention: unsupported shape {tuple(q.shape)}/{k.shape[1]}")

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """RMSNorm of bf16 rows (T, hidden), fp32 inside, rounded as transformers rounds."""
        assert x.dtype == weight.dtype == torch.bfloat16 and x.stride(-1) == 1
        assert weight.is_contiguous()
        out = torch.empty(x.shape, dtype=x.dtype)
        self._rms_norm(x.shape[0], x.shape[1], x.data_ptr(), x.stride(0), weight.data_ptr(), eps,
                       out.data_ptr())  # fmt: skip
        return out

    def rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """`rope.apply_rope` on bf16, equal bit for bit: x (T, heads, d) with unit stride inside
        a head, cos/sin (T, d) or (T, 1, d) in bf16 with contiguous rows; returns a new
        (T, heads, d)."""
        tokens, heads, dim = x.shape
        cos, sin = cos.reshape(tokens, dim), sin.reshape(tokens, dim)
        assert x.dtype == cos.dtype == sin.dtype == torch.bfloat16 and x.stride(2) == 1
        assert cos.stride(1) == sin.stride(1) == 1 and cos.stride(0) == sin.stride(0)
        out = torch.empty((tokens, heads, dim), dtype=x.dtype)
        self._rope(tokens, heads, dim, x.data_ptr(), x.stride(0), x.stride(1), cos.data_ptr(),
                   sin.data_ptr(), cos.stride(0), out.data_ptr())  # fmt: skip
        return out

    def silu_and_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """`pointwise.silu_and_mul` on bf16 rows (T, 2 * width) -> (T, width)."""
        assert gate_up.dtype == torch.bfloat16 and gate_up.stride(1) == 1
        rows, width = gate_up.shape[0], gate_up.shape[1] // 2
        out = torch.empty((rows, width), dtype=gate_up.dtype)
        self._silu_and_mul(rows, width, gate_up.data_ptr(), gate_up.stride(0), out.data_ptr())
        return out

    def linear_few_rows(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        residual: torch.Tensor | None = None,
    ) -> torch.Tensor | None:
        """bf16(x @ weight.T + bias + residual) for up to FEW_ROWS bf16 rows, fp32 inside,
        rounded once; None for more rows (the caller takes another path)."""
        rows, in_features = x.shape
        out_features = weight.shape[0]
        if rows > FEW_ROWS:
            return None
        assert x.dtype == weight.dtype == torch.bfloat16 and x.stride(1) == 1
        assert weight.is_contiguous() and weight.shape[1] == in_features
        for extra in (bias, residual):
            assert extra is None or (extra.dtype == torch.bfloat16 and extra.is_contiguous())
        out = torch.empty((rows, out_features), dtype=x.dtype)
        status = self._linear(rows, in_features, out_features, x.data_ptr(), x.stride(0),
                              weight.data_ptr(), 0 if bias is None else bias.data_ptr(),
                              0 if residual is None else residual.data_ptr(),
                              out.data_ptr())  # fmt: skip
        return None if status else out

    def linear_paired(
        self,
        x: torch.Tensor,
        packed: torch.Tensor,
        bias: torch.Tensor | None = None,
        residual: torch.Tensor | None = None,
    ) -> torch.Tensor | None:
        """bf16(x @ weight.T + bias + residual) for bf16 rows on `packed`, the weight as
        `pair_weight` lays it out; fp32 sums rounded once. None where the kernel does not run:
        a row not 4-byte aligned, or a CPU without AVX512-BF16."""
        rows, in_features = x.shape
        out_features = packed.shape[0] * 16
        if x.stride(1) != 1 or x.data_ptr() % 4 or x.stride(0) % 2:
            return None
        assert x.dtype == packed.dtype == torch.bfloat16 and packed.shape[1] * 2 == in_features
        if residual is not None and (residual.stride(1) != 1 or residual.shape[0] != rows):
            return None
        out = torch.empty((rows, out_features), dtype=x.dtype)
        status = self._paired(rows, in_features, out_features, x.data_ptr(), x.stride(0),
                              packed.data_ptr(), 0 if bias is None else bias.data_ptr(),
                              0 if residual is None else residual.data_ptr(),
                              0 if residual is None else residual.stride(0),
                              out.data_ptr())  # fmt: skip
        return None if status else out

    def softmax_(self, scores: torch.Tensor) -> torch.Tensor:
        """Softmax over the last dim of bf16 scores, in place (rows contiguous, any number of
        leading dims that flatten to rows); returns `scores`. torch's bf16 softmax took ~3 ns
        an element here, a third of a 2k prefill's attention."""
        assert scores.dtype == torch.bfloat16 and scores.stride(-1) == 1
        rows = scores.view(-1, scores.shape[-1])  # raises where leading dims do not flatten
        if self._softmax(rows.shape[0], rows.shape[1], rows.data_ptr(), rows.stride(0)):
            return torch.softmax(scores, dim=-1)  # rows beyond the kernel's buffer
        return scores


def decode_table(entries: list[tuple[int, torch.Tensor, int]]) -> np.ndarray:
    """The per-sequence table `decode_attention` reads, built once a step: for each decode its
    row in the step, its workspace KV (layers, 2, kv_heads, capacity, d) as a view of any
    storage, and its length with the new token."""
    table = np.empty((len(entries), SEQ_FIELDS), dtype=np.int64)
    for i, (row, kv, length) in enumerate(entries):
        assert kv.stride(-1) == 1 and kv.stride(-2) == kv.shape[-1]
        table[i] = (row, kv.data_ptr(), kv.stride(1), kv.stride(0), kv.stride(2), length)
    return table


def pair_weight(weight: torch.Tensor) -> torch.Tensor | None:
    """A bf16 weight (out, in) in `linear_paired`'s layout: (out / 16, in / 2, 16, 2), each
    block of 16 outputs holding every input pair side by side; None for shapes it does not
    cover (an odd `in`, `out` not a multiple of 16)."""
    out_features, in_features = weight.shape
    if out_features % 16 or in_features % 2:
        return None
    blocks = weight.reshape(out_features // 16, 16, in_features // 2, 2)
    return blocks.permute(0, 2, 1, 3).contiguous()


def build_key(flags: frozenset[str] | None = None) -> str:
    """What the built library depends on: source, flags, compiler and (-march=native) CPU."""
    compiler = subprocess.run(["gcc", "--version"], capture_output=True, text=True, check=True)
    digest = hashlib.sha256(SOURCE.read_bytes())
    for part in (" ".join(FLAGS), compiler.stdout, " ".join(sorted(flags or cpu_flags()))):
        digest.update(part.encode())
    return digest.hexdigest()[:16]


def build(directory: Path) -> Path:
    """Compile the library into `directory` unless this build is there; returns its path."""
    target = directory / f"cpu_kernels-{build_key()}.so"
    if target.exists():
        return target
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=directory) as scratch:
        built = Path(scratch) / target.name
        subprocess.run(["gcc", *FLAGS, str(SOURCE), "-o", str(built), "-lm"], check=True,
                       capture_output=True, text=True)  # fmt: skip
        os.replace(built, target)  # atomic: a concurrent builder's copy is as good
    return target


@functools.cache
def load_cpu_kernels() -> CpuKernels | None:
    """The kernels, built if needed; None where they cannot be (no gcc, a failed build)."""
    if shutil.which("gcc") is None:
        log.warning("gcc not found: decode steps use torch's bf16 ops")
        return None
    try:
        return CpuKernels(ctypes.CDLL(str(build(cache_root() / "kernels"))))
    except (OSError, subprocess.CalledProcessError) as error:
        detail = getattr(error, "stderr", "") or error
        log.warning("CPU kernels unavailable (%s): decode steps use torch's bf16 ops", detail)
        return None
