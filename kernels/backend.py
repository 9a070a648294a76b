"""Pick one set of kernels once, at start-up.

Triton on CUDA when triton imports; the torch reference otherwise (on CPU, or CUDA without
triton). Callers hold the returned `KernelBackend` and never branch on the device again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch

from . import reference

logger = logging.getLogger(__name__)

# "reference" is another name for "torch": the reference kernels are the torch backend.
_BACKEND_NAMES = ("torch", "reference", "triton")
_MIN_CAPABILITY = (8, 0)  # Ampere: bf16 tensor-core dots


@dataclass(frozen=True)
class KernelBackend:
    """The four kernels of one backend; each has the signature of its `reference` namesake.

    paged_prefill_attention(q, k_pages, v_pages, page_table, query_start, kv_lens, scale,
                            window=None) -> out
    paged_decode_attention(q, k_pages, v_pages, page_table, kv_lens, scale, window=None) -> out
    gather_pages(kv_pool, page_ids, out=None) -> staging
    scatter_pages(kv_pool, page_ids, staging) -> None
    """

    name: str  # "torch" or "triton"
    paged_prefill_attention: Callable[..., torch.Tensor]
    paged_decode_attention: Callable[..., torch.Tensor]
    gather_pages: Callable[..., torch.Tensor]
    scatter_pages: Callable[..., None]


def torch_backend() -> KernelBackend:
    """The pure-torch reference kernels: run on any device."""
    return KernelBackend(
        name="torch",
        paged_prefill_attention=reference.paged_prefill_attention,
        paged_decode_attention=reference.paged_decode_attention,
        gather_pages=reference.gather_pages,
        scatter_pages=reference.scatter_pages,
    )


def triton_backend() -> KernelBackend:
    """The Triton kernels (CUDA tensors, or CPU tensors under TRITON_INTERPRET=1).

    Raises ImportError with the install command when triton is missing.
    """
    try:
        from . import triton_decode, triton_pages, triton_prefill
    except ImportError as error:
        raise ImportError(
            f"the triton kernel backend needs triton ({error}); "
            "install it with `pip install 'tieredkv[triton]'`"
        ) from error
    return KernelBackend(
        name="triton",
        paged_prefill_attention=triton_prefill.paged_prefill_attention,
        paged_decode_attention=triton_decode.paged_decode_attention,
        gather_pages=triton_pages.gather_pages,
        scatter_pages=triton_pages.scatter_pages,
    )


def select_backend(device: torch.device, prefer: str | None = None) -> KernelBackend:
    """The kernels to use for tensors on `device`.

    prefer=None: Triton on CUDA (compute capability >= 8.0) when triton imports, else torch
    (logged). prefer="torch" (alias "reference") or "triton" forces that backend; "triton" on a
    non-CUDA device is allowed only when the Triton interpreter is on (TRITON_INTERPRET=1), for
    tests.
    """
    device = torch.device(device)
    if prefer is not None and prefer not in _BACKEND_NAMES:
        raise ValueError(f"prefer: expected one of {_BACKEND_NAMES} or None, got {prefer!r}")
    if prefer in ("torch", "reference") or (prefer is None and device.type != "cuda"):
        return torch_backend()
    if prefer == "triton":
        backend = triton_backend()
        _require_runnable(device)
        return backend
    try:
        backend = triton_backend()
    except ImportError as error:
        logger.warning("kernels: using the torch reference on %s: %s", device, error)
        return torch_backend()
    capability = torch.cuda.get_device_capability(device)
    if capability < _MIN_CAPABILITY:
        logger.warning(
            "kernels: using the torch reference on %s: compute capability %s is below the %s "
            "the Triton kernels need (bf16 dots)",
            device,
            capability,
            _MIN_CAPABILITY,
        )
        return torch_backend()
    return backend


def _require_runnable(device: torch.device) -> None:
    from .triton_support import INTERPRETING

    if device.type != "cuda" and not INTERPRETING:
        raise ValueError(
            f"device: the triton backend needs a CUDA device, got {device} "
            "(or set TRITON_INTERPRET=1 before importing triton)"
        )
