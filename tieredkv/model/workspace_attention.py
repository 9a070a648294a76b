"""`WorkspaceAttention`: the CPU production path of attention.

Gathering a sequence's scattered pages every step would copy its whole context per layer per
token, so each running sequence keeps a contiguous copy of its KV (its workspace, see
tieredkv.model.workspace), filled once from the pool when the sequence starts and appended to as
it grows. Memory cost: one extra copy of the running sequences' KV, within `budget_bytes`
(the arena's resident memory, see tieredkv.model.workspace_budget).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from tieredkv.cache.pools.device_pool import DevicePool
from tieredkv.model.attention import AttentionBackend
from tieredkv.model.causal_attention import causal_attention, suffix_mask
from tieredkv.model.cpu_kernels import CpuKernels, decode_table
from tieredkv.model.forward_batch import ForwardBatch, SequenceChunk
from tieredkv.model.matmul_attention import (
    matmul_causal_attention,
    matmul_decode_attention,
    torch_softmax,
)
from tieredkv.model.promotion_fill import PromotionFills
from tieredkv.model.window_attention import window_attention
from tieredkv.model.workspace import SpareWorkspaces, Workspace, WorkspaceArena, fill_helper
from tieredkv.model_config import ModelConfig


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
    and the additive mask (S, 1, 1, kv_len) that hides every slot's keys past its own end (per
    sliding window W, one that also hides those before the last W)."""

    rows: torch.Tensor  # (B,) int64, the decodes' rows in the step
    slots: torch.Tensor  # (B,) int64, slot - first
    positions: torch.Tensor  # (B,) int64, where each new token's K/V goes
    first: int
    num_slots: int
    kv_len: int
    mask: torch.Tensor
    window_masks: dict[int, torch.Tensor]


class WorkspaceAttention(AttentionBackend):
    """CPU production path: per-sequence contiguous KV, filled from the pool once (see
    tieredkv.model.workspace). Attention runs SDPA, or with `matmul=True` blocked batched
    matmuls (tieredkv.model.matmul_attention: bf16 on a CPU without AMX). A step's decodes in
    arena slots attend together, one call a layer (eight 1k-token decodes: one instead of
    eight); with `kernels` (tieredkv.model.cpu_kernels, bf16) every decode of the step, in a
    slot or not, goes to one C call a layer that also stores its new K/V. A sliding layer
    attends each chunk through `window_attention`, and its decodes through the same calls with
    their windows (`config`: the model's windows and scale; None: full layers)."""

    def __init__(
        self,
        pool: DevicePool,
        max_seqs: int = 0,
        max_len: int = 0,
        matmul: bool = False,
        kernels: CpuKernels | None = None,
        budget_bytes: int | None = None,
        config: ModelConfig | None = None,
    ) -> None:
        super().__init__(pool, config)
        self.matmul = matmul
        self.kernels = kernels
        self._workspaces: dict[int, Workspace] = {}
        budget_tokens = None if budget_bytes is None else budget_bytes // pool.layout.token_bytes
        self._arena = (
            WorkspaceArena(pool, max_seqs, max_len, budget_tokens) if max_seqs and max_len else None
        )
        self._spares = SpareWorkspaces(pool)
        self._promotion_fills = PromotionFills(pool, self._arena) if self._arena else None
        self._fill_helper = fill_helper()
        self._step_views: list[_ChunkViews] = []
        self._decodes: _DecodeGroup | None = None
        self._decode_table: np.ndarray | None = None  # the kernels' decodes this step

    @property
    def workspace_bytes(self) -> int:
        """The arena's budget: what it holds resident with no sequence running past it."""
        if self._arena is None:
            return 0
        return self._arena.budget.budget_tokens * self.pool.layout.token_bytes

    def workspace_usage(self) -> dict:
        """For /health: the budget, the arena's and the spares' resident bytes, slots in use."""
        arena = self._arena
        return {
            "budget_bytes": self.workspace_bytes,
            "resident_bytes": 0 if arena is None else arena.resident_bytes,
            "spare_bytes": self._spares.nbytes,
            "running": len(self._workspaces),
        }

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
            if workspace.slot is not None and self._arena is not None:
                self._arena.grow(workspace.slot, chunk.end)
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
        key_pos = torch.arange(kv_len).unsqueeze(0)
        hidden = key_pos >= ends.unsqueeze(1)  # (S, kv_len)
        mask = torch.zeros((num_slots, kv_len), dtype=self.pool.layout.dtype)
        windows = {w for w in self.layer_windows if w is not None}
        window_masks = {
            w: mask.masked_fill(hidden | (key_pos < ends.unsqueeze(1) - w), float("-inf")).view(
                num_slots, 1, 1, kv_len
            )
            for w in windows
        }
        return _DecodeGroup(
            rows=torch.tensor([offsets[i] for i in grouped], dtype=torch.int64),
            slots=torch.tensor([slot - first for slot in slots], dtype=torch.int64),
            positions=torch.tensor([chunk.start for chunk in chunks], dtype=torch.int64),
            first=first,
            num_slots=num_slots,
            kv_len=kv_len,
            mask=mask.masked_fill_(hidden, float("-inf")).view(num_slots, 1, 1, kv_len),
            window_masks=window_masks,
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
            self.kernels.decode_attention(
                table, layer, q, k, v, out, self.window_of(layer), self.scale
            )
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
        matmul_kernels = self.kernels if self.matmul else None
        softmax = matmul_kernels.softmax_ if matmul_kernels is not None else torch_softmax
        window = self.window_of(layer)
        if window is not None:
            scale = self.scale_for(q.shape[-1])
            return window_attention(rows, keys, values, window, scale, softmax)
        if self.matmul:
            return matmul_causal_attention(rows, keys, values, softmax, self.scale)
        return causal_attention(rows, keys, values, view.mask, self.scale)

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
        window = self.window_of(layer)
        mask = group.mask if window is None else group.window_masks[window]
        if self.matmul:
            attended = matmul_decode_attention(
                queries, keys[:, :, : group.kv_len], values[:, :, : group.kv_len], mask, self.scale
            )
            out.index_copy_(0, group.rows, attended.index_select(0, group.slots).squeeze(2))
            return
        attended = F.scaled_dot_product_attention(
            queries,
            keys[:, :, : group.kv_len],  # (S, kv_heads, kv_len, head_dim)
            values[:, :, : group.kv_len],
            attn_mask=mask,
            enable_gqa=True,
            scale=self.scale,
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
