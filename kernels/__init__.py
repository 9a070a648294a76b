"""Kernels for tieredkv (installed as tieredkv.kernels).

`reference` is the specification: pure torch, runs anywhere. The Triton versions
(`triton_prefill`, `triton_decode`, `triton_pages`) are tested against it and import triton only
when imported themselves. `select_backend` picks one set once at start-up:

    backend = select_backend(torch.device("cuda"))
    out = backend.paged_decode_attention(q, k_pages, v_pages, page_table, kv_lens, scale)
"""

from .backend import KernelBackend, select_backend

__all__ = ["KernelBackend", "select_backend"]
