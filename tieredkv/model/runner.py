"""The model runner: a loaded model, its device pool and attention backend, chosen once.

`ModelRunner.forward` runs one step for a list of `SequenceChunk`s. `PagedSequence` gives a
cache-free way to drive it (tests, benchmarks); the engine drives the same runner with pages
from the tiered cache.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from tieredkv.cache.page_layout import PageLayout
from tieredkv.cache.pools.device_pool import DevicePool
from tieredkv.model.attention import AttentionBackend, PagedKernelAttention
from tieredkv.model.cpu_kernels import load_cpu_kernels
from tieredkv.model.forward_batch import ForwardBatch, SequenceChunk
from tieredkv.model.gemma3 import Gemma3Model
from tieredkv.model.llama import LlamaModel
from tieredkv.model.matmul_attention import prefers_c_decode, prefers_matmul_attention
from tieredkv.model.workspace_attention import WorkspaceAttention
from tieredkv.model_config import ModelConfig

DEFAULT_MAX_SEQS = 16  # running sequences whose CPU workspaces share one arena (EngineConfig's)
# ModelConfig.architecture -> its forward pass, where it is not LlamaModel's
MODEL_CLASSES: dict[str, type[LlamaModel]] = {"gemma3_text": Gemma3Model}


def make_attention(
    pool: DevicePool,
    backend: str = "auto",
    max_seqs: int = 0,
    max_len: int = 0,
    workspace_bytes: int | None = None,
    config: ModelConfig | None = None,
) -> AttentionBackend:
    """ "auto": Triton kernels on CUDA, the workspace path on CPU (an arena of `max_seqs`
    workspaces of `max_len` tokens; SDPA, or blocked matmuls for bf16 on a CPU with AVX512-BF16
    but without AMX; bf16 decodes on a CPU without AMX run in C where gcc built `cpu_kernels`).
    "reference": the torch reference kernels over pages in place (slow; for cross-checking).
    `workspace_bytes`: the arena's resident budget (None: all its slots). `config`: the model
    whose per-layer windows and attention scale the backend keeps (None: full layers)."""
    if backend == "auto":
        backend = "triton" if pool.device.type == "cuda" else "workspace"
    if backend == "workspace":
        matmul = prefers_matmul_attention(pool.layout.dtype, pool.device)
        kernels = load_cpu_kernels() if prefers_c_decode(pool.layout.dtype, pool.device) else None
        return WorkspaceAttention(
            pool,
            max_seqs,
            max_len,
            matmul=matmul,
            kernels=kernels,
            budget_bytes=workspace_bytes,
            config=config,
        )
    from tieredkv.kernels.backend import select_backend

    return PagedKernelAttention(pool, select_backend(pool.device, prefer=backend), config)


class ModelRunner:
    """Runs forward steps; owns nothing but the model, the pool and the attention state (whose
    helper thread `close()` stops)."""

    def __init__(
        self,
        config: ModelConfig,
        weights: dict[str, torch.Tensor],
        pool: DevicePool,
        max_model_len: int,
        attention_backend: str = "auto",
        max_seqs: int = DEFAULT_MAX_SEQS,
        workspace_bytes: int | None = None,
    ) -> None:
        self.config = config
        self.pool = pool
        self.page_size = pool.layout.page_size
        self.max_model_len = max_model_len
        self.attention = make_attention(
            pool, attention_backend, max_seqs, max_model_len, workspace_bytes, config
        )
        model_class = MODEL_CLASSES.get(config.architecture, LlamaModel)
        self.model = model_class(config, weights, self.attention, max_model_len, pool.device)

    @classmethod
    def create(
        cls,
        config: ModelConfig,
        weights: dict[str, torch.Tensor],
        num_pages: int,
        page_size: int = 16,
        max_model_len: int = 4096,
        device: torch.device | str = "cpu",
        attention_backend: str = "auto",
        max_seqs: int = DEFAULT_MAX_SEQS,
    ) -> ModelRunner:
        dtype = weights["model.embed_tokens.weight"].dtype
        pool = DevicePool(PageLayout.for_model(config, page_size, dtype), num_pages, device)
        return cls(config, weights, pool, max_model_len, attention_backend, max_seqs)

    def forward(self, chunks: Sequence[SequenceChunk]) -> torch.Tensor:
        """Logits (B, vocab) fp32 of each chunk's last token."""
        batch = ForwardBatch.build(chunks, self.page_size, self.pool.device)
        return self.model.forward(batch)

    def forward_with_rows(
        self, chunks: Sequence[SequenceChunk], every_row: Sequence[int] = ()
    ) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """`forward`, plus the logits (num_new, vocab) fp32 of every token of the chunks whose
        indexes `every_row` lists (prompt logprobs)."""
        if not every_row:
            return self.forward(chunks), {}
        batch = ForwardBatch.build(chunks, self.page_size, self.pool.device)
        x = self.model.hidden(batch)
        offsets = batch.query_start.tolist()
        rows = {i: self.model.head(x[offsets[i] : offsets[i + 1]]) for i in every_row}
        return self.model.head(x[batch.logits_indices]), rows

    def expect_prefix(self, seq_id: int, pages: Sequence[int | None]) -> None:
        """`seq_id`'s cached prefix is on its way to pool pages `pages` (see
        tieredkv.model.promotion_fill): the attention may prepare for it meanwhile."""
        self.attention.expect_prefix(seq_id, pages)

    def pages_landed(self, pages: Sequence[int]) -> None:
        """Pool pages `pages` hold their verified KV now (any thread)."""
        self.attention.pages_landed(pages)

    def release(self, seq_id: int) -> None:
        self.attention.release(seq_id)

    def close(self) -> None:
        """Stop the attention backend's threads; the runner runs no step after this."""
        self.attention.close()


@dataclass
class PagedSequence:
    """A sequence that takes pages from the pool as it grows (no sharing, no tree)."""

    seq_id: int
    token_ids: list[int]
    kv_len: int = 0  # tokens whose K/V are in the pages
    page_ids: list[int] = field(default_factory=list)

    def next_chunk(self, pool: DevicePool, max_tokens: int | None = None) -> SequenceChunk:
        """The tokens not yet forwarded (at most `max_tokens`), with pages allocated for them."""
        end = len(self.token_ids) if max_tokens is None else self.kv_len + max_tokens
        end = min(end, len(self.token_ids))
        needed = -(-end // pool.layout.page_size) - len(self.page_ids)
        if needed > 0:
            self.page_ids.extend(pool.alloc(needed))
        chunk = SequenceChunk(
            self.seq_id, self.token_ids[self.kv_len : end], self.kv_len, self.page_ids
        )
        self.kv_len = end
        return chunk

    def free(self, pool: DevicePool) -> None:
        pool.free(self.page_ids)
        self.page_ids = []
