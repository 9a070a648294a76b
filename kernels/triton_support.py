"""What the Triton kernels share: the interpreter switch and the device check.

Importing this module imports triton; only `backend.select_backend` and the tests do so. Triton
decides at decoration time whether a kernel is compiled or interpreted (`TRITON_INTERPRET=1`,
read when the kernel modules are imported), so it must be set before they are imported.
"""

from __future__ import annotations

import functools

import torch
import triton

# Read once, beside the kernels' own decorators, so the two can never disagree.
INTERPRETING: bool = bool(triton.knobs.runtime.interpret)


def dot_in_fp32(dtype: torch.dtype) -> bool:
    """Whether kernels must upcast `tl.dot` operands to fp32.

    The interpreter's `tl.dot` returns garbage on bf16 operands (its loads, stores and fp16/fp32
    dots are right), so interpreted kernels upcast; compiled kernels keep bf16 tensor-core dots.
    """
    return INTERPRETING and dtype == torch.bfloat16


def dot_precision(dtype: torch.dtype) -> str | None:
    """fp32 inputs get exact fp32 dots (TF32 would miss the reference's tolerance); other dtypes
    keep the target's default (None), which every backend accepts."""
    return "ieee" if dtype == torch.float32 else None


def check_device(name: str, tensor: torch.Tensor) -> None:
    """Compiled kernels need CUDA tensors; the interpreter runs on CPU tensors."""
    if not INTERPRETING and tensor.device.type != "cuda":
        raise ValueError(
            f"{name}: the Triton kernels need a CUDA tensor, got one on {tensor.device} "
            "(set TRITON_INTERPRET=1 before importing triton to run them on CPU)"
        )


@functools.lru_cache(maxsize=8)
def num_compute_units(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device (a small stand-in under the interpreter)."""
    if device.type != "cuda":
        return 4
    return torch.cuda.get_device_properties(device).multi_processor_count
