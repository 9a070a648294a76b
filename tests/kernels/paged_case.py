"""Build paged attention inputs from dense per-sequence K/V, with pages in shuffled order.

Everything a kernel must not read is NaN: the pool's unused pages, the tail of each sequence's
last page, and the pages that the page table's unused tail entries name. A kernel that reads
past kv_len, or through an unused entry, turns its output into NaN.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

NUM_LAYERS = 2
LAYER = 1  # attention reads kv_pool[LAYER, 0/1]: a strided view at an offset, as in the model


@dataclass(frozen=True)
class PagedCase:
    q: torch.Tensor  # (num_tokens, num_heads, head_dim)
    kv_pool: torch.Tensor  # (NUM_LAYERS, 2, num_pages, page_size, num_kv_heads, head_dim)
    page_table: torch.Tensor  # (batch, max_pages_per_seq) int32
    query_start: torch.Tensor  # (batch + 1,) int32
    kv_lens: torch.Tensor  # (batch,) int32
    keys: list[torch.Tensor]  # per sequence (kv_len, num_kv_heads, head_dim), dense
    values: list[torch.Tensor]
    scale: float

    @property
    def k_pages(self) -> torch.Tensor:
        return self.kv_pool[LAYER, 0]

    @property
    def v_pages(self) -> torch.Tensor:
        return self.kv_pool[LAYER, 1]

    def prefill_args(self) -> tuple:
        return (self.q, self.k_pages, self.v_pages, self.page_table, self.query_start,
                self.kv_lens, self.scale)  # fmt: skip

    def decode_args(self) -> tuple:
        return (self.q, self.k_pages, self.v_pages, self.page_table, self.kv_lens, self.scale)


def make_case(
    q_lens: list[int],
    kv_lens: list[int],
    *,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    page_size: int,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    seed: int = 0,
) -> PagedCase:
    generator = torch.Generator().manual_seed(seed)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=generator).to(dtype)

    pages_per_seq = [-(-kv_len // page_size) for kv_len in kv_lens]
    width = max(pages_per_seq) + 2  # unused tail entries in every row
    num_pages = sum(pages_per_seq) + 3  # pages nobody owns
    shape = (NUM_LAYERS, 2, num_pages, page_size, num_kv_heads, head_dim)
    kv_pool = torch.full(shape, float("nan"), dtype=dtype)
    order = torch.randperm(num_pages, generator=generator)
    spare = order[sum(pages_per_seq) :]
    page_table = spare[torch.randint(len(spare), (len(kv_lens), width), generator=generator)]
    keys, values, next_page = [], [], 0
    for i, kv_len in enumerate(kv_lens):
        pages = order[next_page : next_page + pages_per_seq[i]]
        next_page += pages_per_seq[i]
        page_table[i, : len(pages)] = pages
        keys.append(randn(kv_len, num_kv_heads, head_dim))
        values.append(randn(kv_len, num_kv_heads, head_dim))
        for n in range(kv_len):  # one token at a time: the plainest statement of the layout
            page, offset = pages[n // page_size], n % page_size
            kv_pool[LAYER, 0, page, offset] = keys[-1][n]
            kv_pool[LAYER, 1, page, offset] = values[-1][n]
    starts = torch.tensor([0, *q_lens]).cumsum(0)
    return PagedCase(
        q=randn(sum(q_lens), num_heads, head_dim).to(device),
        kv_pool=kv_pool.to(device),
        page_table=page_table.to(torch.int32).to(device),
        query_start=starts.to(torch.int32).to(device),
        kv_lens=torch.tensor(kv_lens, dtype=torch.int32, device=device),
        keys=[k.to(device) for k in keys],
        values=[v.to(device) for v in values],
        scale=head_dim**-0.5,
    )


def naive_attention(case: PagedCase, q_lens: list[int], window: int | None = None) -> torch.Tensor:
    """Dense per-sequence attention in float64: explicit mask, GQA by repeat_interleave; with
    a sliding `window`, query p sees keys p - window < j <= p."""
    num_heads = case.q.shape[1]
    outputs, start = [], 0
    for keys, values, q_len in zip(case.keys, case.values, q_lens, strict=True):
        kv_len = keys.shape[0]
        group = num_heads // keys.shape[1]
        q = case.q[start : start + q_len].double()  # (q_len, heads, d)
        k = keys.double().repeat_interleave(group, dim=1)  # (kv_len, heads, d)
        v = values.double().repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q, k) * case.scale
        # Query j is token kv_len - q_len + j: it sees keys up to that token.
        mask = torch.ones(q_len, kv_len, dtype=torch.bool, device=q.device)
        mask = mask.tril(diagonal=kv_len - q_len)
        if window is not None:
            mask = mask.triu(diagonal=kv_len - q_len - window + 1)
        scores = scores.masked_fill(~mask, float("-inf"))
        outputs.append(torch.einsum("hqk,khd->qhd", scores.softmax(-1), v))
        start += q_len
    return torch.cat(outputs).to(case.q.dtype)
