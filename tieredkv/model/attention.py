"""Attention over the paged device pool: the contract every backend keeps, and the paged-kernel
backend.

Every backend writes a step's new K/V into the pool's pages (the tree reuses them later) and
attends each new token to its sequence's KV: cached prefix + earlier chunks + itself, causal
aligned bottom-right (query i of a chunk starting at `start` sees keys 0..start+i). Each layer
keeps the model's window and scale (`ModelConfig.window_of`, `attention_scale`):

  full layer (window None)   the query at p sees keys 0 .. p
  sliding layer (window W)   the query at p sees keys p - W + 1 .. p, and reads none before
                             them: those of a sliding layer's pages may hold other KV by then
  scores                     q.k * attention_scale (1/sqrt(head_dim) unless the model says
                             otherwise: Gemma's query_pre_attn_scalar)

- `WorkspaceAttention` (tieredkv.model.workspace_attention) is the CPU production path: each
  running sequence keeps a contiguous copy of its KV.
- `PagedKernelAttention` attends to the pages in place through a kernel backend (Triton on CUDA;
  the torch reference anywhere, which is how tests cross-check the workspace path).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence

import torch

from tieredkv.cache.pools.device_pool import DevicePool
from tieredkv.model.forward_batch import ForwardBatch
from tieredkv.model_config import ModelConfig


class AttentionBackend(ABC):
    """Stores new K/V into the pool and attends; one instance per model runner. `config`: the
    model's per-layer windows and scale (None: every layer full, scaled by 1/sqrt(head_dim))."""

    def __init__(self, pool: DevicePool, config: ModelConfig | None = None) -> None:
        self.pool = pool
        self.page_size = pool.layout.page_size
        self.layer_windows = config.layer_windows if config is not None else ()
        # None: 1/sqrt(head_dim) as each path computes it (SDPA's own default); a float only
        # where the model scales otherwise, so the Llama family's arithmetic stays as it is
        custom = config is not None and config.query_pre_attn_scalar is not None
        self.scale: float | None = config.attention_scale if custom else None

    def window_of(self, layer: int) -> int | None:
        """Layer `layer`'s sliding window in tokens, or None (full attention)."""
        return self.layer_windows[layer] if self.layer_windows else None

    def scale_for(self, head_dim: int) -> float:
        """The attention scores' scale as a number."""
        return 1.0 / math.sqrt(head_dim) if self.scale is None else self.scale

    @property
    def workspace_bytes(self) -> int:
        """Memory reserved for running sequences' KV outside the pool (0: none)."""
        return 0

    def store_kv(self, layer: int, k: torch.Tensor, v: torch.Tensor, batch: ForwardBatch) -> None:
        """Write new tokens' K/V (T, kv_heads, head_dim) into their pool slots."""
        self.pool.store(layer, k, v, batch.slot_mapping)

    @abstractmethod
    def begin_step(self, batch: ForwardBatch) -> None:
        """Prepare per-step state once, before the first layer."""

    @abstractmethod
    def attend(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: ForwardBatch
    ) -> torch.Tensor:
        """q (T, heads, head_dim), k/v (T, kv_heads, head_dim) -> (T, heads, head_dim)."""

    def expect_prefix(self, seq_id: int, pages: Sequence[int | None]) -> None:  # noqa: B027
        """A promotion started for `seq_id`: its prefix page i lands in pool page `pages[i]`
        (None: not read by it). Optional hook: see `pages_landed`."""

    def pages_landed(self, pages: Sequence[int]) -> None:  # noqa: B027 - optional hook
        """Pool pages `pages` hold their verified KV now (called on the transfer jobs' threads)."""

    def release(self, seq_id: int) -> None:  # noqa: B027 - optional hook
        """Forget per-sequence state (finished, aborted or preempted sequence)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Stop any thread the backend started (the runner is done with it)."""


class PagedKernelAttention(AttentionBackend):
    """Attends to the pool's pages in place through a `tieredkv.kernels` backend."""

    def __init__(
        self, pool: DevicePool, kernels: object, config: ModelConfig | None = None
    ) -> None:
        super().__init__(pool, config)
        self.kernels = kernels
        self._page_table: torch.Tensor | None = None
        self._kv_lens: torch.Tensor | None = None

    def begin_step(self, batch: ForwardBatch) -> None:
        width = max(len(chunk.page_ids) for chunk in batch.chunks)
        table = torch.zeros((len(batch.chunks), width), dtype=torch.int32)
        for i, chunk in enumerate(batch.chunks):
            table[i, : len(chunk.page_ids)] = torch.as_tensor(chunk.page_ids, dtype=torch.int32)
        self._page_table = table.to(self.pool.device)
        kv_lens = [chunk.end for chunk in batch.chunks]
        self._kv_lens = torch.tensor(kv_lens, dtype=torch.int32, device=self.pool.device)

    def attend(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: ForwardBatch
    ) -> torch.Tensor:
        self.store_kv(layer, k, v, batch)
        k_pages, v_pages = self.pool.layer_kv(layer)
        assert self._page_table is not None
        table = self.pool.layer_table(layer, self._page_table)
        scale, window = self.scale_for(q.shape[-1]), self.window_of(layer)
        if batch.is_decode_only:
            return self.kernels.paged_decode_attention(
                q, k_pages, v_pages, table, self._kv_lens, scale, window
            )
        return self.kernels.paged_prefill_attention(
            q, k_pages, v_pages, table, batch.query_start, self._kv_lens, scale, window
        )
