"""The sliding-page rule: which pages keep their sliding part, where a match may continue from,
and that a continuation from there reads no dropped page (attention with the dropped pages'
sliding KV poisoned equals attention over everything)."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest
import torch
from tieredkv.kernels import reference

from tieredkv.cache.page_layout import PageLayout
from tieredkv.cache.sliding_pages import (
    LayerKinds,
    held_by_layer_kind,
    history_tokens,
    kept_sliding_pages,
    reusable_tokens,
    tokens_by_layer_kind,
    window_pages,
)
from tieredkv.cache.tier import Tier
from tieredkv.model_config import ModelConfig

DOCS = Path(__file__).parents[3] / "docs" / "architecture.md"


def test_window_pages_are_the_pages_a_continuation_reads() -> None:
    assert window_pages(64, 32, 16) == range(2, 4)  # tokens 33..63
    assert window_pages(64, 33, 16) == range(2, 4)  # tokens 32..63
    assert window_pages(64, 34, 16) == range(1, 4)  # tokens 31..63
    assert window_pages(16, 1000, 16) == range(0, 1)
    assert window_pages(48, 1, 16) == range(3, 3)  # a window of 1 reads no cached key


@pytest.mark.parametrize("seed", range(20))
def test_every_reuse_point_continues_whole_and_others_go_back_no_further(seed: int) -> None:
    rng = random.Random(seed)
    page_size, window = rng.choice([4, 16]), rng.choice([1, 5, 16, 37, 64])
    num_pages = rng.randint(1, 40)
    points = sorted(rng.sample(range(1, num_pages + 1), rng.randint(1, num_pages)))
    points = [p * page_size for p in points]
    kept = kept_sliding_pages(num_pages, points, window, page_size)
    for point in points:
        assert reusable_tokens(point, kept, window, page_size) == point
    for match in range(0, num_pages * page_size + 1, page_size):
        start = reusable_tokens(match, kept, window, page_size)
        assert start <= match and start >= max([p for p in points if p <= match], default=0)
        assert all(kept[page] for page in window_pages(start, window, page_size)) or start == 0


@pytest.mark.parametrize("seed", range(6))
def test_a_continuation_reads_no_dropped_sliding_page(seed: int) -> None:
    """The reference kernel over a path whose dropped pages hold NaN, continued from where
    `reusable_tokens` says, equals the same attention over intact pages."""
    rng = random.Random(seed)
    page_size, window = 4, rng.choice([5, 9, 16])
    num_pages = 24
    points = [p * page_size for p in sorted(rng.sample(range(1, num_pages), 3))]
    kept = kept_sliding_pages(num_pages, [*points, num_pages * page_size], window, page_size)
    match = rng.randrange(page_size, num_pages * page_size, page_size)
    start = reusable_tokens(match, kept, window, page_size)
    new = 6  # the continuation's own tokens
    kv_len = start + new
    generator = torch.Generator().manual_seed(seed)
    pool = torch.randn((1, 2, num_pages + 2, page_size, 2, 16), generator=generator)
    table = torch.arange(num_pages + 2, dtype=torch.int32).unsqueeze(0)
    q = torch.randn((new, 4, 16), generator=generator)
    args = (table, torch.tensor([0, new], dtype=torch.int32), torch.tensor([kv_len]), 0.25)
    intact = reference.paged_prefill_attention(q, pool[0, 0], pool[0, 1], *args, window=window)
    for page in range(start // page_size):
        if not kept[page]:
            pool[0, :, page] = float("nan")
    dropped = reference.paged_prefill_attention(q, pool[0, 0], pool[0, 1], *args, window=window)
    assert torch.equal(intact, dropped)


def test_layer_kinds_of_a_model() -> None:
    config = ModelConfig(
        vocab_size=8, hidden_size=64, intermediate_size=8, num_layers=6, num_heads=4,
        num_kv_heads=2, head_dim=16, layer_windows=(32, 32, None, 32, 32, None),
    )  # fmt: skip
    kinds = LayerKinds.of(config, PageLayout.for_model(config, 16, torch.bfloat16))
    assert (kinds.full_layers, kinds.sliding_layers, kinds.window) == (2, 4, 32)
    assert kinds.layer_token_bytes == 2 * 2 * 16 * 2
    assert kinds.describe()["sliding"] == {"layers": 4, "window": 32, "token_bytes": 512}


def test_without_sliding_layers_nothing_changes() -> None:
    kinds = LayerKinds(full_layers=30, sliding_layers=0, window=None, layer_token_bytes=768)
    assert history_tokens(1 << 30, kinds, 4096, 16) == (46603, 46603)  # 1 GiB / 23,040 B


# name: (full layers, sliding layers, window, kv heads, head_dim), from the models' configs
GEMMA3 = {
    "gemma-3-1b": (4, 22, 512, 1, 256),
    "gemma-3-4b": (5, 29, 1024, 4, 256),
    "gemma-3-12b": (8, 40, 1024, 8, 256),
    "gemma-3-27b": (10, 52, 1024, 16, 128),
}


def gemma3_row(name: str) -> list[str]:
    """The docs' row for `name`: tokens a 64 GiB tier holds, all layers -> the rule, bf16,
    page 16, paths of 4k, 32k and 128k tokens."""
    full, sliding, window, kv_heads, head_dim = GEMMA3[name]
    kinds = LayerKinds(full, sliding, window, 2 * kv_heads * head_dim * 2)
    cells = [f"`{name}`", f"{full} + {sliding}", str(window)]
    for path in (4096, 32768, 131072):
        before, after = history_tokens(64 << 30, kinds, path, 16)
        cells.append(f"{before / 1e6:.2f}M → {after / 1e6:.2f}M ({after / before:.1f}x)")
    return cells


@pytest.mark.parametrize("name", list(GEMMA3))
def test_the_docs_gemma3_table_is_the_rules_arithmetic(name: str) -> None:
    text = DOCS.read_text(encoding="utf-8")
    rows = [line for line in text.splitlines() if line.startswith(f"| `{name}` |")]
    assert len(rows) == 1, f"docs/architecture.md: one table row for {name}"
    cells = [cell.strip() for cell in rows[0].strip("|").split("|")]
    assert cells == gemma3_row(name), re.sub(r"\s+", " ", rows[0])


def test_health_says_what_each_tier_holds_per_layer_kind() -> None:
    config = ModelConfig(
        vocab_size=8, hidden_size=64, intermediate_size=8, num_layers=2, num_heads=4,
        num_kv_heads=2, head_dim=16, layer_windows=(None, 32),
    )  # fmt: skip
    layout = PageLayout.for_model(config, 16, torch.float32)
    pages = {Tier.DEVICE: (3, 3), Tier.HOST: (5, 2), Tier.DISK: (0, 0), Tier.REMOTE: (0, 0)}
    held = held_by_layer_kind(config, layout, pages.__getitem__)
    expected = {"device": 48, "host": 80, "disk": 0, "remote": 0}
    assert held["full"] == {"layers": 1, "token_bytes": 256, "tokens_by_tier": expected}
    sliding = {"device": 48, "host": 32, "disk": 0, "remote": 0}  # a split host pool: 2 of 5
    assert held["sliding"]["window"] == 32 and held["sliding"]["tokens_by_tier"] == sliding


def test_a_model_without_sliding_layers_holds_no_sliding_tokens() -> None:
    config = ModelConfig(
        vocab_size=8, hidden_size=64, intermediate_size=8, num_layers=2, num_heads=4,
        num_kv_heads=2, head_dim=16,
    )  # fmt: skip
    pages = {Tier.DEVICE: (3, 3), Tier.HOST: (5, 5), Tier.DISK: (2, 2), Tier.REMOTE: (0, 0)}
    tokens = tokens_by_layer_kind(config, 16, pages.__getitem__)
    assert tokens["full"] == {Tier.DEVICE: 48, Tier.HOST: 80, Tier.DISK: 32, Tier.REMOTE: 0}
    assert tokens["sliding"] == dict.fromkeys(Tier, 0)  # the same series, at 0
