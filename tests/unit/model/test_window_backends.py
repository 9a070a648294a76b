"""Every attention backend against plain masked softmax, with a full and a sliding layer.

Two sequences run steps together: one prefills in chunks that cross the window and then
decodes, the other decodes beside it; a third starts after a cached prefix longer than the
window. Each step's output, per layer, equals dense attention over the sequence's K/V so far
with the layer's window and the model's scale.
"""

from __future__ import annotations

import pytest
import torch
from tieredkv.kernels.backend import torch_backend

from tieredkv.cache.page_layout import PageLayout
from tieredkv.cache.pools.device_pool import DevicePool
from tieredkv.model.attention import AttentionBackend, PagedKernelAttention
from tieredkv.model.cpu_kernels import load_cpu_kernels
from tieredkv.model.forward_batch import ForwardBatch, SequenceChunk
from tieredkv.model.window_attention import window_attention
from tieredkv.model.workspace_attention import WorkspaceAttention
from tieredkv.model_config import ModelConfig

HEADS, KV_HEADS, HEAD_DIM, PAGE_SIZE, WINDOW = 4, 2, 16, 4, 12


def model_config(windows: tuple[int | None, ...], scalar: float | None = None) -> ModelConfig:
    return ModelConfig(
        vocab_size=32,
        hidden_size=HEADS * HEAD_DIM,
        intermediate_size=32,
        num_layers=len(windows),
        num_heads=HEADS,
        num_kv_heads=KV_HEADS,
        head_dim=HEAD_DIM,
        layer_windows=windows,
        query_pre_attn_scalar=scalar,
    )


def dense(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, window: int | None, scale: float
) -> torch.Tensor:
    """q (n, heads, d) at the last n of kv_len positions; keys/values (kv_len, kv_heads, d)."""
    n, kv_len = q.shape[0], keys.shape[0]
    k = keys.double().repeat_interleave(HEADS // KV_HEADS, 1)  # (kv_len, heads, d)
    v = values.double().repeat_interleave(HEADS // KV_HEADS, 1)
    scores = torch.einsum("qhd,khd->hqk", q.double(), k) * scale
    query_pos = torch.arange(kv_len - n, kv_len).unsqueeze(1)
    key_pos = torch.arange(kv_len).unsqueeze(0)
    hidden = key_pos > query_pos
    if window is not None:
        hidden |= key_pos <= query_pos - window
    probs = scores.masked_fill(hidden, float("-inf")).softmax(-1)
    return torch.einsum("hqk,khd->qhd", probs, v)


class Stream:
    """One sequence's pages and the K/V and queries of each of its positions (per layer)."""

    def __init__(self, seq_id: int, pool: DevicePool, length: int, dtype: torch.dtype) -> None:
        generator = torch.Generator().manual_seed(100 + seq_id)
        layers = pool.layout.num_layers

        def randn(*shape: int) -> torch.Tensor:
            return torch.randn(shape, generator=generator).to(dtype)

        self.seq_id = seq_id
        self.q = randn(layers, length, HEADS, HEAD_DIM)
        self.k = randn(layers, length, KV_HEADS, HEAD_DIM)
        self.v = randn(layers, length, KV_HEADS, HEAD_DIM)
        self.pages = pool.alloc(-(-length // PAGE_SIZE))
        self.done = 0

    def cache_prefix(self, pool: DevicePool, tokens: int) -> None:
        """Write the first `tokens` positions' K/V into the pages, as a reused prefix."""
        for pos in range(tokens):
            page, offset = self.pages[pos // PAGE_SIZE], pos % PAGE_SIZE
            pool.kv[:, 0, page, offset] = self.k[:, pos]
            pool.kv[:, 1, page, offset] = self.v[:, pos]
        self.done = tokens

    def chunk(self, count: int) -> SequenceChunk:
        chunk = SequenceChunk(self.seq_id, [0] * count, self.done, self.pages)
        self.done += count
        return chunk


def run_steps(
    backend: AttentionBackend, config: ModelConfig, steps: list[list[tuple[Stream, int]]]
) -> None:
    """Run each step through `backend`, every layer, checking its rows against `dense`."""
    scale = config.attention_scale
    for step in steps:
        chunks = [stream.chunk(count) for stream, count in step]
        batch = ForwardBatch.build(chunks, PAGE_SIZE)
        backend.begin_step(batch)
        for layer in range(config.num_layers):
            rows = [
                (stream, chunk.start, chunk.end)
                for (stream, _), chunk in zip(step, chunks, strict=True)
            ]
            q = torch.cat([s.q[layer, lo:hi] for s, lo, hi in rows])
            k = torch.cat([s.k[layer, lo:hi] for s, lo, hi in rows])
            v = torch.cat([s.v[layer, lo:hi] for s, lo, hi in rows])
            out = backend.attend(layer, q, k, v, batch)
            at = 0
            for stream, lo, hi in rows:
                expected = dense(
                    stream.q[layer, lo:hi],
                    stream.k[layer, :hi],
                    stream.v[layer, :hi],
                    config.window_of(layer),
                    scale,
                )
                got = out[at : at + hi - lo].double()
                tolerance = 1e-5 if q.dtype == torch.float32 else 3e-2
                torch.testing.assert_close(got, expected, atol=tolerance, rtol=tolerance)
                at += hi - lo


def scenario(pool: DevicePool, dtype: torch.dtype) -> list[list[tuple[Stream, int]]]:
    """Chunked prefill across the window beside decodes, then a start after a long prefix."""
    a, b, c = (Stream(i, pool, 64, dtype) for i in range(3))
    c.cache_prefix(pool, 37)  # longer than the window
    steps = [[(a, 7)], [(a, 10), (b, 5)], [(a, 13), (b, 1)]]
    steps += [[(a, 1), (b, 1)] for _ in range(14)]  # decodes past the window, together
    steps += [[(c, 9), (a, 1)], [(c, 1), (a, 1), (b, 1)], [(c, 1), (b, 1)]]
    return steps


BACKENDS = ["workspace-sdpa", "workspace-matmul", "workspace-arena", "paged-reference"]


def make_backend(kind: str, pool: DevicePool, config: ModelConfig) -> AttentionBackend:
    if kind == "paged-reference":
        return PagedKernelAttention(pool, torch_backend(), config)
    arena = (8, 128) if kind == "workspace-arena" else (0, 0)
    return WorkspaceAttention(pool, *arena, matmul=kind == "workspace-matmul", config=config)


@pytest.mark.parametrize("kind", BACKENDS)
@pytest.mark.parametrize("scalar", [None, 24.0])
def test_each_backend_honours_windows_and_scale_in_fp32(kind: str, scalar: float | None) -> None:
    config = model_config((None, WINDOW, 5), scalar)
    pool = DevicePool(PageLayout.for_model(config, PAGE_SIZE, torch.float32), 64, "cpu")
    backend = make_backend(kind, pool, config)
    try:
        run_steps(backend, config, scenario(pool, torch.float32))
    finally:
        backend.close()


@pytest.mark.parametrize("kind", [*BACKENDS, "workspace-c-decode"])
def test_each_backend_honours_windows_in_bf16(kind: str) -> None:
    config = model_config((WINDOW, None))
    pool = DevicePool(PageLayout.for_model(config, PAGE_SIZE, torch.bfloat16), 64, "cpu")
    if kind == "workspace-c-decode":
        kernels = load_cpu_kernels()
        if kernels is None:
            pytest.skip("the C kernels do not build here (no gcc)")
        backend: AttentionBackend = WorkspaceAttention(
            pool, 8, 128, matmul=True, kernels=kernels, config=config
        )
    else:
        backend = make_backend(kind, pool, config)
    try:
        run_steps(backend, config, scenario(pool, torch.bfloat16))
    finally:
        backend.close()


@pytest.mark.parametrize(("n", "kv_len"), [(1, 1), (1, 40), (7, 7), (20, 50), (300, 300)])
@pytest.mark.parametrize("window", [1, 6, 128, 1000])
def test_window_attention_matches_dense(n: int, kv_len: int, window: int) -> None:
    """Across query blocks (128 rows), after a prefix, windows shorter and longer than both."""
    generator = torch.Generator().manual_seed(n * 7 + kv_len)
    q = torch.randn(n, HEADS, HEAD_DIM, generator=generator)
    keys = torch.randn(kv_len, KV_HEADS, HEAD_DIM, generator=generator)
    values = torch.randn(kv_len, KV_HEADS, HEAD_DIM, generator=generator)
    # keys no query's window reaches are NaN: they must not be read
    first = max(0, kv_len - n - window + 1)
    poisoned_k, poisoned_v = keys.clone(), values.clone()
    poisoned_k[:first], poisoned_v[:first] = float("nan"), float("nan")
    got = window_attention(
        q, poisoned_k.transpose(0, 1), poisoned_v.transpose(0, 1), window, HEAD_DIM**-0.5
    )
    expected = dense(q, keys, values, window, HEAD_DIM**-0.5)
    torch.testing.assert_close(got.double(), expected, atol=1e-5, rtol=1e-5)
