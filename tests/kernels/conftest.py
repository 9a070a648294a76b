"""Kernel tests run the Triton kernels compiled on a CUDA machine, interpreted on CPU.

Triton decides per kernel, when the kernel's module is imported, whether to interpret it; so the
interpreter switch is set here, before any test module imports a kernel module. An explicit
TRITON_INTERPRET in the environment wins.
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="session")
def triton_kernels():
    """The Triton backend, or a clean skip when triton is missing or cannot run here."""
    pytest.importorskip("triton")
    from tieredkv.kernels.backend import triton_backend
    from tieredkv.kernels.triton_support import INTERPRETING

    if not INTERPRETING and not torch.cuda.is_available():
        pytest.skip("triton kernels need CUDA or TRITON_INTERPRET=1 set before triton's import")
    return triton_backend()


@pytest.fixture(scope="session")
def device(triton_kernels) -> torch.device:
    """Where the Triton tests put their tensors: CPU under the interpreter, else CUDA."""
    from tieredkv.kernels.triton_support import INTERPRETING

    return torch.device("cpu" if INTERPRETING else "cuda")
