"""A page in two parts, by layer kind: the full layers' KV and the sliding-window layers' KV.

A store that keeps a page without its sliding part (`sliding_pages`: no continuation reads it)
keeps the full part alone. Each part is its own contiguous page-major buffer:

| part    | layers                                 | shape (one page)                          |
|---------|----------------------------------------|-------------------------------------------|
| full    | `window_of(layer) is None`, in order   | (full_layers, 2, page_size, kv_heads, hd) |
| sliding | the others, in order                   | (sliding_layers, 2, page_size, kv_heads,  |
|         |                                        |  hd)                                      |

Without sliding layers the full part is the whole page in the same byte order and the sliding
part is empty, so the Llama family's pages are the same bytes with or without parts. Pure: no
I/O, no state.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tieredkv.cache.page_layout import PageLayout
from tieredkv.model_config import ModelConfig

_LAYER_DIM = 1  # of a run of pages: (num_pages, layers, 2, page_size, kv_heads, head_dim)


@dataclass(frozen=True)
class PageParts:
    """Which layers of a page make each part, and the parts' sizes."""

    layout: PageLayout
    full_layers: tuple[int, ...]
    sliding_layers: tuple[int, ...]

    def __post_init__(self) -> None:
        layers = sorted((*self.full_layers, *self.sliding_layers))
        assert layers == list(range(self.layout.num_layers)), (
            f"parts {self.full_layers} + {self.sliding_layers} are not the layout's "
            f"{self.layout.num_layers} layers"
        )

    @classmethod
    def of(cls, model: ModelConfig, layout: PageLayout) -> PageParts:
        layers = range(model.num_layers)
        return cls(
            layout,
            full_layers=tuple(layer for layer in layers if model.window_of(layer) is None),
            sliding_layers=tuple(layer for layer in layers if model.window_of(layer) is not None),
        )

    @property
    def has_sliding(self) -> bool:
        return bool(self.sliding_layers)

    @property
    def layer_page_bytes(self) -> int:
        """One layer's K and V of one page."""
        return self.layout.page_bytes // self.layout.num_layers

    @property
    def full_bytes(self) -> int:
        return len(self.full_layers) * self.layer_page_bytes

    @property
    def sliding_bytes(self) -> int:
        return len(self.sliding_layers) * self.layer_page_bytes

    def part_shape(self, sliding: bool) -> tuple[int, int, int, int, int]:
        """One page's part, page-major."""
        _, *rest = self.layout.page_shape
        return (len(self.sliding_layers if sliding else self.full_layers), *rest)

    def describe(self) -> str:
        """A stable text form for a store's layout record: the layers of each part."""
        full = ",".join(map(str, self.full_layers))
        sliding = ",".join(map(str, self.sliding_layers))
        return f"parts=full:{full};sliding:{sliding}"

    def gather(self, pages: torch.Tensor, sliding: bool) -> torch.Tensor:
        """One part of a run of page-major pages, contiguous:
        (num_pages, layers, 2, ps, kv_heads, hd) -> (num_pages, part layers, 2, ps, kv, hd)."""
        if not sliding and not self.has_sliding:
            return pages.contiguous()
        return pages.index_select(_LAYER_DIM, self._index(sliding, pages.device))

    def scatter(self, pages: torch.Tensor, part: torch.Tensor, sliding: bool) -> None:
        """Write one part (as `gather` returns it) into a run of page-major pages in place; the
        other part's layers are left as they are."""
        expected = (pages.shape[0], *self.part_shape(sliding))
        assert tuple(part.shape) == expected, f"part {tuple(part.shape)} != {expected}"
        pages.index_copy_(_LAYER_DIM, self._index(sliding, pages.device), part)

    def _index(self, sliding: bool, device: torch.device) -> torch.Tensor:
        layers = self.sliding_layers if sliding else self.full_layers
        return torch.tensor(layers, dtype=torch.long, device=device)
