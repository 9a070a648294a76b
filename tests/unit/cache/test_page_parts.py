"""A page in two parts by layer kind: each part is exactly its layers' bytes, the parts put
back make the page, and without sliding layers the full part is the whole page unchanged."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tieredkv.cache.page_layout import PageLayout
from tieredkv.cache.page_parts import PageParts
from tieredkv.model_config import ModelConfig


def config(windows: tuple[int | None, ...]) -> ModelConfig:
    return ModelConfig(
        vocab_size=8, hidden_size=64, intermediate_size=8, num_layers=len(windows), num_heads=4,
        num_kv_heads=2, head_dim=16, layer_windows=windows,
    )  # fmt: skip


GEMMA_LIKE = (32, 32, None, 32, 32, None)  # sliding, sliding, full, ...


def random_pages(layout: PageLayout, num_pages: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(num_pages)
    shape = (num_pages, *layout.page_shape)
    return torch.randn(shape, generator=generator).to(layout.dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_each_part_holds_its_layers_and_both_make_the_page(dtype: torch.dtype) -> None:
    model = config(GEMMA_LIKE)
    layout = PageLayout.for_model(model, 4, dtype)
    parts = PageParts.of(model, layout)
    assert parts.full_layers == (2, 5) and parts.sliding_layers == (0, 1, 3, 4)
    assert parts.full_bytes + parts.sliding_bytes == layout.page_bytes
    assert parts.sliding_bytes == 2 * parts.full_bytes
    pages = random_pages(layout, 3)
    full, sliding = parts.gather(pages, sliding=False), parts.gather(pages, sliding=True)
    assert full.is_contiguous() and full.numel() * full.element_size() == 3 * parts.full_bytes
    assert torch.equal(full[:, 1], pages[:, 5]) and torch.equal(sliding[:, 2], pages[:, 3])
    rebuilt = torch.full_like(pages, float("nan"))
    parts.scatter(rebuilt, full, sliding=False)
    assert torch.isnan(rebuilt[:, 0]).all() and torch.equal(rebuilt[:, 2], pages[:, 2])
    parts.scatter(rebuilt, sliding, sliding=True)
    assert torch.equal(rebuilt.view(torch.uint8), pages.view(torch.uint8))


def test_a_full_part_written_alone_leaves_the_sliding_layers_as_they_were() -> None:
    model = config(GEMMA_LIKE)
    layout = PageLayout.for_model(model, 4, torch.float32)
    parts = PageParts.of(model, layout)
    pages, stale = random_pages(layout, 2), random_pages(layout, 5)[:2]
    target = stale.clone()
    parts.scatter(target, parts.gather(pages, sliding=False), sliding=False)
    assert torch.equal(target[:, list(parts.full_layers)], pages[:, list(parts.full_layers)])
    assert torch.equal(target[:, list(parts.sliding_layers)], stale[:, list(parts.sliding_layers)])


def test_without_sliding_layers_the_full_part_is_the_whole_page() -> None:
    model = config((None, None, None))
    layout = PageLayout.for_model(model, 4, torch.bfloat16)
    parts = PageParts.of(model, layout)
    assert not parts.has_sliding and parts.full_bytes == layout.page_bytes
    assert parts.sliding_bytes == 0 and parts.part_shape(sliding=True)[0] == 0
    pages = random_pages(layout, 2)
    full = parts.gather(pages, sliding=False)
    assert torch.equal(full.view(torch.uint8), pages.view(torch.uint8))
    assert PageParts.of(dataclasses.replace(model, layer_windows=()), layout) == parts


def test_describe_names_the_layers_of_each_part() -> None:
    model = config(GEMMA_LIKE)
    parts = PageParts.of(model, PageLayout.for_model(model, 4, torch.float32))
    assert parts.describe() == "parts=full:2,5;sliding:0,1,3,4"
