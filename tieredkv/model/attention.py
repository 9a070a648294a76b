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

_QUERY_BLOCK = 128  # queries per block in prefill attention (fastest here at 64-256)


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

    In both paths the `group` query heads of a kv head fold into the query axis, so K/V are
    never expanded for GQA:
      n == 1   decode: SDPA, no mask needed
      n > 1    prefill (fresh, chunked, or a suffix after a cached prefix): causal attention in
               query blocks, aligned bottom-right; see `blocked_causal_attention`
    """
    n, heads, head_dim = q.shape
    kv_heads = keys.shape[0]
    group = heads // kv_heads
    if n == 1:
        folded = q.view(1, kv_heads, group, head_dim)  # (1, kv_heads, group, d)
        out = F.scaled_dot_product_attention(folded, keys.unsqueeze(0), values.unsqueeze(0))
        return out.reshape(1, heads, head_dim)
    return blocked_causal_attention(q, keys, values)


def blocked_causal_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, block: int = _QUERY_BLOCK
) -> torch.Tensor:
    """Causal attention as two batched matmuls per block of `block` queries.

    On CPU this is several times faster than SDPA's flash kernel for prefill: the matmuls run on
    oneDNN (AMX for bf16) and each block reads only the keys it may see, so the masked upper
    triangle is never computed. Scores are in the model dtype (as transformers' eager path
    computes them); softmax accumulates in fp32. Query i of the n sits at kv_len - n + i:

        block of queries [s, e)   sees keys [0, kv_len - n + e)
        its keys [kv_len - n + s, kv_len - n + e) get the strictly-upper-triangular mask
    """
    n, heads, head_dim = q.shape
    kv_heads, kv_len = keys.shape[0], keys.shape[1]
    group = heads // kv_heads
    offset = kv_len - n
    scaled = (q * head_dim**-0.5).view(n, kv_heads, group, head_dim).permute(1, 2, 0, 3)
    out = torch.empty_like(q)  # (n, heads, head_dim)
    upper = torch.ones(block, block, dtype=torch.bool, device=q.device).triu(1)
    for s in range(0, n, block):
        e = min(n, s + block)
        size, visible = e - s, offset + e
        q_block = scaled[:, :, s:e].reshape(kv_heads, group * size, head_dim)
        scores = torch.bmm(q_block, keys[:, :visible].transpose(1, 2))  # (kv, group*size, vis)
        diagonal = scores.view(kv_heads, group, size, visible)[..., offset + s :]
        diagonal.masked_fill_(upper[:size, :size], float("-inf"))
        probs = torch.softmax(scores, dim=-1)  # accumulates in fp32, stores in the model dtype
        block_out = torch.bmm(probs, values[:, :visible])  # (kv_heads, group * size, d)
        out[s:e] = block_out.view(kv_heads, group, size, head_dim).permute(2, 0, 1, 3).flatten(1, 2)
    return out


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
