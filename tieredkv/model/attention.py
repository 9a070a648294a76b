"""Attention over the paged device pool.

Every backend writes a step's new K/V into the pool's pages (the tree reuses them later) and
attends each new token to its sequence's whole KV: cached prefix + earlier chunks + itself,
causal aligned bottom-right (query i of a chunk starting at `start` sees keys 0..start+i).

- `WorkspaceAttention` is the CPU production path. Gathering a sequence's scattered pages every
  step would copy its whole context per layer per token, so each running sequence keeps a
  contiguous copy of its KV (its workspace), filled once from the pool when the sequence starts
  and appended to as it grows. Memory cost: one extra copy of the running sequences' KV.
- `PagedKernelAttention` attends to the pages in place through a kernel backend (Triton on CUDA;
  the torch reference anywhere, which is how tests cross-check the workspace path).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod

import torch
import torch.nn.functional as F

from tieredkv.cache.device_pool import DevicePool
from tieredkv.model.forward_batch import ForwardBatch
from tieredkv.model.workspace import SpareWorkspaces, Workspace


class AttentionBackend(ABC):
    """Stores new K/V into the pool and attends; one instance per model runner."""

    def __init__(self, pool: DevicePool) -> None:
        self.pool = pool
        self.page_size = pool.layout.page_size

    def store_kv(self, layer: int, k: torch.Tensor, v: torch.Tensor, batch: ForwardBatch) -> None:
        """Write new tokens' K/V (T, kv_heads, head_dim) into their pool slots."""
        kv_heads, head_dim = k.shape[1], k.shape[2]
        self.pool.kv[layer, 0].view(-1, kv_heads, head_dim).index_copy_(0, batch.slot_mapping, k)
        self.pool.kv[layer, 1].view(-1, kv_heads, head_dim).index_copy_(0, batch.slot_mapping, v)

    @abstractmethod
    def begin_step(self, batch: ForwardBatch) -> None:
        """Prepare per-step state once, before the first layer."""

    @abstractmethod
    def attend(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: ForwardBatch
    ) -> torch.Tensor:
        """q (T, heads, head_dim), k/v (T, kv_heads, head_dim) -> (T, heads, head_dim)."""

    def release(self, seq_id: int) -> None:  # noqa: B027 - optional hook
        """Forget per-sequence state (finished, aborted or preempted sequence)."""


class WorkspaceAttention(AttentionBackend):
    """CPU production path: per-sequence contiguous KV, filled from the pool once (released
    workspaces are reused: see tieredkv.model.workspace)."""

    def __init__(self, pool: DevicePool) -> None:
        super().__init__(pool)
        self._workspaces: dict[int, Workspace] = {}
        self._spares = SpareWorkspaces(pool)

    def begin_step(self, batch: ForwardBatch) -> None:
        for chunk in batch.chunks:
            workspace = self._workspaces.get(chunk.seq_id)
            if workspace is None:
                workspace = self._spares.take(chunk.end)
                self._workspaces[chunk.seq_id] = workspace
            if workspace.length > chunk.start:  # the caller rolled the sequence back
                workspace.length = chunk.start
            if workspace.length < chunk.start:  # a cached prefix: copy it in once
                workspace.fill_from_pool(self.pool, chunk.page_ids, chunk.start)
            if chunk.end > workspace.capacity:
                workspace.grow(chunk.end)
            workspace.length = chunk.end  # the layers fill start..end during this step

    def attend(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: ForwardBatch
    ) -> torch.Tensor:
        self.store_kv(layer, k, v, batch)
        out = torch.empty_like(q)
        offsets = batch.query_start.tolist()
        for i, chunk in enumerate(batch.chunks):
            lo, hi = offsets[i], offsets[i + 1]
            kv = self._workspaces[chunk.seq_id].kv[layer]  # (2, kv_heads, capacity, head_dim)
            kv[0, :, chunk.start : chunk.end] = k[lo:hi].transpose(0, 1)
            kv[1, :, chunk.start : chunk.end] = v[lo:hi].transpose(0, 1)
            out[lo:hi] = attend_one(q[lo:hi], kv[0, :, : chunk.end], kv[1, :, : chunk.end])
        return out

    def release(self, seq_id: int) -> None:
        workspace = self._workspaces.pop(seq_id, None)
        if workspace is not None:
            self._spares.give(workspace)

    @property
    def num_workspaces(self) -> int:
        return len(self._workspaces)


def attend_one(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """One sequence: q (n, heads, head_dim) are the last n of keys/values (kv_heads, kv_len, d).

    Both cases run torch's fused CPU attention (SDPA: flash-style blocks on oneDNN, AMX for
    bf16), with K/V never expanded for GQA:
      n == 1   decode: the `group` query heads of a kv head fold into the query axis, no mask
      n > 1    prefill (fresh, chunked, or a suffix after a cached prefix): causal, aligned
               bottom-right; see `causal_attention`
    """
    n, heads, head_dim = q.shape
    kv_heads = keys.shape[0]
    group = heads // kv_heads
    if n == 1:
        folded = q.view(1, kv_heads, group, head_dim)  # (1, kv_heads, group, d)
        out = F.scaled_dot_product_attention(folded, keys.unsqueeze(0), values.unsqueeze(0))
        return out.reshape(1, heads, head_dim)
    return causal_attention(q, keys, values)


def causal_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """Causal attention of the last n positions, query i at kv_len - n + i (bottom-right).

    SDPA's `is_causal` aligns top-left, right only when there is no earlier context; with one,
    an explicit mask lets query i see keys [0, kv_len - n + i]. Returns (n, heads, head_dim).
    """
    n = q.shape[0]
    kv_len = keys.shape[1]
    offset = kv_len - n
    mask = None
    if offset > 0:
        key_pos = torch.arange(kv_len, device=q.device)
        query_pos = torch.arange(offset, kv_len, device=q.device)
        mask = key_pos.unsqueeze(0) <= query_pos.unsqueeze(1)  # (n, kv_len) bool
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1).unsqueeze(0),  # (1, heads, n, d)
        keys.unsqueeze(0),  # (1, kv_heads, kv_len, d)
        values.unsqueeze(0),
        attn_mask=mask,
        is_causal=mask is None,
        enable_gqa=True,
    )  # (1, heads, n, d)
    return out[0].transpose(0, 1)


class PagedKernelAttention(AttentionBackend):
    """Attends to the pool's pages in place through a `tieredkv.kernels` backend."""

    def __init__(self, pool: DevicePool, kernels: object) -> None:
        super().__init__(pool)
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
        k_pages, v_pages = self.pool.kv[layer, 0], self.pool.kv[layer, 1]
        scale = 1.0 / math.sqrt(q.shape[-1])
        if batch.is_decode_only:
            return self.kernels.paged_decode_attention(
                q, k_pages, v_pages, self._page_table, self._kv_lens, scale
            )
        return self.kernels.paged_prefill_attention(
            q, k_pages, v_pages, self._page_table, batch.query_start, self._kv_lens, scale
        )
