"""What one prompt costs the served model: its prefill FLOPs and its KV's bytes.

The TTFT bound counts "the suffix's prefill time". Dividing the suffix's length by the baseline's
average prefill speed undercounts it: a suffix token after a 3k-token prefix attends to all of
it, while the baseline's average token attends to half the prompt. So the suffix gets its share
of the same request's recompute TTFT in proportion to the FLOPs a decoder layer stack spends:

    linear   2 * layers * (hidden * (q + k + v widths) + q width * hidden + 3 * hidden * inter)
             per token (projections and the gated MLP; the LM head runs for the last token only)
    attention  2 * 2 * layers * heads * head_dim per (query, visible key) pair (QK^T and PV)

A suffix of `s` tokens after a prefix of `c` sees c + 1 .. c + s keys per query. The bound's
transfer time counts the history's KV bytes: whole pages of the model's layout at its dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

from tieredkv.model_config import ModelConfig


@dataclass(frozen=True)
class PrefillCost:
    linear_flops_per_token: float
    attention_flops_per_pair: float
    page_bytes: int = 0  # one page of KV (all layers, K and V) at the served dtype
    page_size: int = 16  # tokens per page

    @classmethod
    def of(cls, config: ModelConfig, page_bytes: int = 0, page_size: int = 16) -> PrefillCost:
        hidden, inter = config.hidden_size, config.intermediate_size
        q_width = config.num_heads * config.head_dim
        kv_width = config.num_kv_heads * config.head_dim
        per_layer = hidden * (q_width + 2 * kv_width) + q_width * hidden + 3 * hidden * inter
        return cls(
            linear_flops_per_token=2.0 * config.num_layers * per_layer,
            attention_flops_per_pair=4.0 * config.num_layers * q_width,
            page_bytes=page_bytes,
            page_size=page_size,
        )

    def flops(self, prefix: int, suffix: int) -> float:
        """FLOPs to prefill `suffix` tokens after `prefix` cached ones."""
        pairs = suffix * prefix + suffix * (suffix + 1) / 2
        return suffix * self.linear_flops_per_token + pairs * self.attention_flops_per_pair

    def suffix_share(self, prompt_tokens: int, cached_tokens: int) -> float:
        """The suffix's share of the whole prompt's prefill FLOPs."""
        whole = self.flops(0, prompt_tokens)
        return self.flops(cached_tokens, prompt_tokens - cached_tokens) / whole if whole else 0.0

    def history_bytes(self, num_tokens: int) -> int:
        """The KV bytes of `num_tokens` cached tokens: their whole pages."""
        return num_tokens // self.page_size * self.page_bytes


def load_model_cost(
    model: str | None, dtype: str = "float32", page_size: int | None = None
) -> PrefillCost | None:
    """The cost model of a local model directory (None: the default model) at `dtype` and
    `page_size` (None: the server's default); None when its config cannot be read."""
    import torch

    from tieredkv.cache.page_layout import PageLayout
    from tieredkv.config import CacheConfig
    from tieredkv.errors import TieredKVError
    from tieredkv.model.hf_config import parse_model_config, read_config_json
    from tieredkv.model.loader import resolve_model_dir

    page_size = page_size or CacheConfig.page_size
    try:
        model_dir = resolve_model_dir(model)
        config = parse_model_config(read_config_json(model_dir), model_dir)
    except (TieredKVError, OSError):
        return None
    layout = PageLayout.for_model(config, page_size, getattr(torch, dtype))
    return PrefillCost.of(config, layout.page_bytes, page_size)
