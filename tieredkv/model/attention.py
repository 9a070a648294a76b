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
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from tieredkv.cache.pools.device_pool import DevicePool
from tieredkv.model.cpu_kernels import CpuKernels, decode_table
from tieredkv.model.forward_batch import ForwardBatch, SequenceChunk
from tieredkv.model.matmul_attention import (
    matmul_causal_attention,
    matmul_decode_attention,
    torch_softmax,
)
from tieredkv.model.promotion_fill import PromotionFills
from tieredkv.model.workspace import SpareWorkspaces, Workspace, WorkspaceArena, fill_helper


class AttentionBackend(ABC):
    """Stores new K/V into the pool and attends; one instance per model runner."""

    def __init__(self, pool: DevicePool) -> None:
        self.pool = pool
        self.page_size = pool.layout.page_size

    @property
    def workspace_bytes(self) -> int:
        """Memory reserved for running sequences' KV outside the pool (0: none)."""
        return 0

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

    def expect_prefix(self, seq_id: int, pages: Sequence[int | None]) -> None:  # noqa: B027
        """A promotion started for `seq_id`: its prefix page i lands in pool page `pages[i]`
        (None: not read by it). Optional hook: see `pages_landed`."""

    def pages_landed(self, pages: Sequence[int]) -> None:  # noqa: B027 - optional hook
        """Pool pages `pages` hold their verified KV now (called on the copier's threads)."""

    def release(self, seq_id: int) -> None:  # noqa: B027 - optional hook
        """Forget per-sequence state (finished, aborted or preempted sequence)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Stop any thread the backend started (the runner is done with it)."""


@dataclass(frozen=True)
class _ChunkViews:
    """One chunk's rows of the step (lo:hi) and its workspace K/V up to its end, all layers."""

    lo: int
    hi: int
    start: int  # tokens before the chunk
    keys: torch.Tensor  # (layers, kv_heads, end, head_dim), a view of the workspace
    values: torch.Tensor
    mask: torch.Tensor | None  # see `suffix_mask`: built once a step, read by every layer


@dataclass(frozen=True)
class _DecodeGroup:
    """A step's decodes whose workspaces are arena slots, attended in one call over the slot
    range [first, first + S): rows and positions of the new tokens, each one's slot - first,
    and the additive mask (S, 1, 1, kv_len) that hides every slot's keys past its own end."""

    rows: torch.Tensor  # (B,) int64, the decodes' rows in the step
    slots: torch.Tensor  # (B,) int64, slot - first
    positions: torch.Tensor  # (B,) int64, where each new token's K/V goes
    first: int
    num_slots: int
    kv_len: int
    mask: torch.Tensor


class WorkspaceAttention(AttentionBackend):
    """CPU production path: per-sequence contiguous KV, filled from the pool once (see
    tieredkv.model.workspace). Attention runs SDPA, or with `matmul=True` blocked batched
    matmuls (tieredkv.model.matmul_attention: bf16 on a CPU without AMX). A step's decodes in
    arena slots attend together, one call a layer (eight 1k-token decodes: one instead of
    eight); with `kernels` (tieredkv.model.cpu_kernels, bf16) every decode of the step, in a
    slot or not, goes to one C call a layer that also stores its new K/V."""

    def __init__(
        self,
        pool: DevicePool,
        max_seqs: int = 0,
        max_len: int = 0,
        matmul: bool = False,
        kernels: CpuKernels | None = None,
    ) -> None:
        super().__init__(pool)
        self.matmul = matmul
        self.kernels = kernels
        self._workspaces: dict[int, Workspace] = {}
        self._arena = WorkspaceArena(pool, max_seqs, max_len) if max_seqs and max_len else None
        self._spares = SpareWorkspaces(pool)
        self._promotion_fills = PromotionFills(pool, self._arena) if self._arena else None
        self._fill_helper = fill_helper()
        self._step_views: list[_ChunkViews] = []
        self._decodes: _DecodeGroup | None = None
        self._decode_table: np.ndarray | None = None  # the kernels' decodes this step

    @property
    def workspace_bytes(self) -> int:
        return 0 if self._arena is None else self._arena.nbytes

    def _workspace(self, chunk: SequenceChunk) -> tuple[Workspace, np.ndarray | None]:
        """The chunk's sequence's workspace; for a sequence's first chunk, also which page
        positions a slot filled during its promotion holds already (None: see its length)."""
        workspace = self._workspaces.get(chunk.seq_id)
        landed = None
        if workspace is None:
            if self._promotion_fills is not None:
                taken = self._promotion_fills.take(chunk.seq_id, chunk.page_ids)
                if taken is not None:
                    workspace, landed = taken
            if workspace is None and self._arena is not None:  # may hold the cached prefix
                workspace = self._arena.take(chunk.end, chunk.page_ids, chunk.start)
            workspace = workspace or self._spares.take(chunk.end)
            self._workspaces[chunk.seq_id] = workspace
        return workspace, landed

    def expect_prefix(self, seq_id: int, pages: Sequence[int | None]) -> None:
        if self._promotion_fills is not None:
            self._promotion_fills.expect(seq_id, pages)

    def pages_landed(self, pages: Sequence[int]) -> None:
        if self._promotion_fills is not None:
            self._promotion_fills.landed(pages)

    def begin_step(self, batch: ForwardBatch) -> None:
        page_size = self.pool.layout.page_size
        for chunk in batch.chunks:
            workspace, landed = self._workspace(chunk)
            if workspace.length > chunk.start:  # the caller rolled the sequence back
                workspace.roll_back(chunk.start, page_size)
            if workspace.length < chunk.start:  # a cached prefix: copy in what it lacks, once
                workspace.fill_from_pool(
                    self.pool, chunk.page_ids, chunk.start, self._fill_helper, landed
                )
            if chunk.end > workspace.capacity:
                workspace.grow(chunk.end)
            workspace.length = chunk.end  # the layers fill start..end during this step
            workspace.mirrors.extend(self.pool, chunk.page_ids, -(-chunk.end // page_size))
        # every layer reads the same slices: take the views once a step, not once a layer
        offsets = batch.query_start.tolist()
        grouped = [
            i
            for i, chunk in enumerate(batch.chunks)
            if chunk.num_new == 1
            and (self.kernels is not None or self._workspaces[chunk.seq_id].slot is not None)
        ]
        self._decode_table = None
        if self.kernels is not None and grouped:
            self._decode_table = decode_table(
                [
                    (offsets[i], self._workspaces[batch.chunks[i].seq_id].kv, batch.chunks[i].end)
                    for i in grouped
                ]
            )
        elif len(grouped) < 2:
            grouped = []
        use_group = grouped and self._decode_table is None
        self._decodes = self._decode_group(batch, grouped, offsets) if use_group else None
        dtype = self.pool.layout.dtype
        in_group = set(grouped)
        self._step_views = [
            _ChunkViews(
                offsets[i],
                offsets[i + 1],
                chunk.start,
                self._workspaces[chunk.seq_id].kv[:, 0, :, : chunk.end],
                self._workspaces[chunk.seq_id].kv[:, 1, :, : chunk.end],
                None if self.matmul else suffix_mask(chunk.num_new, chunk.end, dtype),
            )
            for i, chunk in enumerate(batch.chunks)
            if i not in in_group
        ]

    def _decode_group(
        self, batch: ForwardBatch, grouped: list[int], offsets: list[int]
    ) -> _DecodeGroup:
        chunks = [batch.chunks[i] for i in grouped]
        slots = [self._workspaces[chunk.seq_id].slot for chunk in chunks]
        first, last = min(slots), max(slots)  # type: ignore[type-var]
        num_slots, kv_len = last - first + 1, max(chunk.end for chunk in chunks)
        ends = torch.ones(num_slots, dtype=torch.int64)  # a slot not in the group: key 0 only
        for chunk, slot in zip(chunks, slots, strict=True):
            ends[slot - first] = chunk.end
        hidden = torch.arange(kv_len).unsqueeze(0) >= ends.unsqueeze(1)  # (S, kv_len)
        mask = torch.zeros((num_slots, kv_len), dtype=self.pool.layout.dtype)
        return _DecodeGroup(
            rows=torch.tensor([offsets[i] for i in grouped], dtype=torch.int64),
            slots=torch.tensor([slot - first for slot in slots], dtype=torch.int64),
            positions=torch.tensor([chunk.start for chunk in chunks], dtype=torch.int64),
            first=first,
            num_slots=num_slots,
            kv_len=kv_len,
            mask=mask.masked_fill_(hidden, float("-inf")).view(num_slots, 1, 1, kv_len),
        )

    def attend(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: ForwardBatch
    ) -> torch.Tensor:
        self.store_kv(layer, k, v, batch)
        table = self._decode_table
        if self._decodes is None and table is None and len(self._step_views) == 1:
            return self._attend_chunk(self._step_views[0], layer, q, k, v)
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        if table is not None:
            assert self.kernels is not None
            self.kernels.decode_attention(table, layer, q, k, v, out)
        for view in self._step_views:
            out[view.lo : view.hi] = self._attend_chunk(view, layer, q, k, v)
        if self._decodes is not None:
            self._attend_decodes(self._decodes, layer, q, k, v, out)
        return out

    def _attend_chunk(
        self, view: _ChunkViews, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        keys, values = view.keys[layer], view.values[layer]  # (kv_heads, end, head_dim)
        keys[:, view.start :].copy_(k[view.lo : view.hi].transpose(0, 1))
        values[:, view.start :].copy_(v[view.lo : view.hi].transpose(0, 1))
        rows = q[view.lo : view.hi]
        if self.matmul:
            softmax = self.kernels.softmax_ if self.kernels is not None else torch_softmax
            return matmul_causal_attention(rows, keys, values, softmax)
        return causal_attention(rows, keys, values, view.mask)

    def _attend_decodes(
        self,
        group: _DecodeGroup,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        out: torch.Tensor,
    ) -> None:
        assert self._arena is not None
        slots = self._arena.kv[group.first : group.first + group.num_slots, layer]
        keys, values = slots[:, 0], slots[:, 1]  # (S, kv_heads, capacity, head_dim)
        keys[group.slots, :, group.positions] = k.index_select(0, group.rows)  # (B, kv, d)
        values[group.slots, :, group.positions] = v.index_select(0, group.rows)
        heads, head_dim = q.shape[1], q.shape[2]
        queries = q.new_zeros((group.num_slots, heads, 1, head_dim))
        queries.index_copy_(0, group.slots, q.index_select(0, group.rows).unsqueeze(2))
        if self.matmul:
            attended = matmul_decode_attention(
                queries, keys[:, :, : group.kv_len], values[:, :, : group.kv_len], group.mask
            )
            out.index_copy_(0, group.rows, attended.index_select(0, group.slots).squeeze(2))
            return
        attended = F.scaled_dot_product_attention(
            queries,
            keys[:, :, : group.kv_len],  # (S, kv_heads, kv_len, head_dim)
            values[:, :, : group.kv_len],
            attn_mask=group.mask,
            enable_gqa=True,
        )  # (S, heads, 1, head_dim)
        out.index_copy_(0, group.rows, attended.index_select(0, group.slots).squeeze(2))

    def release(self, seq_id: int) -> None:
        if self._promotion_fills is not None:
            self._promotion_fills.cancel(seq_id)
        workspace = self._workspaces.pop(seq_id, None)
        if workspace is None:
            return
        if workspace.slot is not None:
            assert self._arena is not None
            self._arena.give(workspace)
        else:
            self._spares.give(workspace)

    def close(self) -> None:
        self._fill_helper.shutdown(wait=True)

    @property
    def num_workspaces(self) -> int:
        return len(self._workspaces)


def suffix_mask(n: int, kv_len: int, dtype: torch.dtype) -> torch.Tensor | None:
    """The additive mask of n queries after kv_len - n keys, when `causal_attention` takes one:
    (n, kv_len), 0 where query i sees key j (j <= kv_len - n + i), -inf elsewhere. Additive in
    the model dtype, since SDPA converts a bool mask on every call (4k keys: 1.8 vs 1.3 ms)."""
    offset = kv_len - n
    if offset == 0 or n == 1 or _splits(n):
        return None
    key_pos = torch.arange(kv_len)
    hidden = key_pos.unsqueeze(0) > torch.arange(offset, kv_len).unsqueeze(1)
    return torch.zeros((n, kv_len), dtype=dtype).masked_fill_(hidden, float("-inf"))


def causal_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Causal attention of the last n positions, query i at kv_len - n + i (bottom-right).

    All of it runs torch's fused CPU attention (SDPA), K/V never expanded for GQA. A decode
    step's single query sees every key: no mask (one query per head, 9 heads, shares the two
    threads better than the group folded into the query axis: 87 against 118 us at 1k keys).
    SDPA's `is_causal` aligns top-left, right only when there is no earlier context. After a
    prefix (a cached one, or earlier chunks), a short chunk passes a mask (`mask` if the caller
    built it once for all layers, see `suffix_mask`); a long one attends to the prefix and to
    itself separately, both unmasked or plainly causal, and merges the two by their log-sum-exp:
    a mask costs the kernel every masked block (2,048 queries after 6,144 keys, bf16: 79 ms a
    layer masked, 49 split).
    Returns (n, heads, head_dim).
    """
    n = q.shape[0]
    kv_len = keys.shape[1]
    offset = kv_len - n
    if offset > 0 and _splits(n):
        return _prefix_then_diagonal(q, keys, values, offset)
    if mask is None:
        mask = suffix_mask(n, kv_len, q.dtype)
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1).unsqueeze(0),  # (1, heads, n, d)
        keys.unsqueeze(0),  # (1, kv_heads, kv_len, d)
        values.unsqueeze(0),
        attn_mask=mask,
        is_causal=offset == 0 and n > 1,
        enable_gqa=True,
    )  # (1, heads, n, d)
    return out[0].transpose(0, 1)


def _prefix_then_diagonal(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, offset: int
) -> torch.Tensor:
    """`causal_attention` after `offset` prefix keys, as two flash calls merged exactly.

    The kv heads are the batch and the `group` query heads of each are its heads, K/V broadcast
    over the group (stride 0, no copy): the flash op itself has no GQA.
    """
    n, heads, head_dim = q.shape
    kv_heads = keys.shape[0]
    group = heads // kv_heads
    grouped = q.view(n, kv_heads, group, head_dim).permute(1, 2, 0, 3)  # (kv, group, n, d)

    def part(start: int, end: int, causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
        k = keys[:, None, start:end].expand(kv_heads, group, end - start, head_dim)
        v = values[:, None, start:end].expand(kv_heads, group, end - start, head_dim)
        out, lse = _flash_with_lse(grouped, k, v, 0.0, causal)[:2]
        return out.float(), lse  # (kv, group, n, d), (kv, group, n) fp32

    out_prefix, lse_prefix = part(0, offset, causal=False)
    out_diag, lse_diag = part(offset, offset + n, causal=True)
    top = torch.maximum(lse_prefix, lse_diag)
    w_prefix = torch.exp(lse_prefix - top).unsqueeze(-1)
    w_diag = torch.exp(lse_diag - top).unsqueeze(-1)
    merged = (out_prefix * w_prefix + out_diag * w_diag) / (w_prefix + w_diag)
    return merged.to(q.dtype).permute(2, 0, 1, 3).reshape(n, heads, head_dim)


# aten's CPU flash attention, which also returns the log-sum-exp (None in a build without it)
_flash_with_lse = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
_SPLIT_MIN_QUERIES = 256  # shorter chunks: one masked call is faster (64 queries: 0.8 vs 1.0 ms)


def _splits(n: int) -> bool:
    """Whether n queries after a prefix take the prefix-then-diagonal path."""
    return n >= _SPLIT_MIN_QUERIES and _flash_with_lse is not None


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
