"""Rotary position embeddings: the cos/sin tables and their application.

Hugging Face's `rotate_half` convention: a head's first half pairs with its second half. Only
variants whose frequencies do not depend on the sequence length are here (default, linear,
llama3, yarn). The inverse frequencies are computed with the same fp32 operations as
transformers, so the tables agree with it to float rounding at every position.
"""

from __future__ import annotations

import math

import torch

from tieredkv.model_config import ModelConfig, RopeScaling


def build_rope_cache(
    config: ModelConfig, max_len: int, device: torch.device | str, sliding: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin) for positions 0..max_len-1, each (max_len, head_dim) fp32 on `device`, with
    the variant's attention scaling (yarn's mscale) already multiplied in. `sliding`: the table
    of the sliding-window layers, which differs where the config has a local base (Gemma 3)."""
    inv_freq, scale = rope_inv_freq(config, sliding)  # (head_dim // 2,) fp32
    positions = torch.arange(max_len, dtype=torch.float32)  # (max_len,)
    freqs = torch.outer(positions, inv_freq)  # (max_len, head_dim // 2)
    emb = torch.cat((freqs, freqs), dim=-1)  # (max_len, head_dim)
    cos, sin = emb.cos() * scale, emb.sin() * scale
    return cos.to(device), sin.to(device)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate `x` (num_tokens, heads, head_dim) by per-token cos/sin, already indexed by each
    token's position: (num_tokens, head_dim), or (num_tokens, 1, head_dim) to skip a view.

    Computes in the dtype of cos/sin (pass them in x's dtype to round as transformers does; the
    model keeps its tables in its own dtype), returns x's dtype.
    """
    if cos.dim() == 2:
        cos, sin = cos[:, None, :], sin[:, None, :]
    x1, x2 = x.chunk(2, dim=-1)
    rotated = torch.cat((-x2, x1), dim=-1)  # rotate_half(x)
    return (x * cos + rotated * sin).to(x.dtype)  # (num_tokens, heads, head_dim)


def rope_inv_freq(config: ModelConfig, sliding: bool = False) -> tuple[torch.Tensor, float]:
    """The (head_dim // 2,) fp32 inverse frequencies and the cos/sin scale of `config` (of its
    sliding layers with `sliding`: the unscaled local base where the config has one)."""
    scaling = config.rope_scaling
    dim = config.head_dim
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float32) / dim
    if sliding and config.rope_local_theta is not None:
        return 1.0 / config.rope_local_theta**exponents, 1.0
    pos_freqs = config.rope_theta**exponents  # (dim // 2,) wavelengths / 2π
    inv_freq = 1.0 / pos_freqs
    original_len = scaling.original_max_position_embeddings or config.max_position_embeddings
    if scaling.kind == "linear":
        return inv_freq / scaling.factor, 1.0
    if scaling.kind == "llama3":
        return _llama3(inv_freq, scaling, original_len), 1.0
    if scaling.kind == "yarn":
        return _yarn(pos_freqs, scaling, original_len, dim, config.rope_theta)
    assert scaling.kind == "default", scaling.kind
    return inv_freq, 1.0


def _llama3(inv_freq: torch.Tensor, scaling: RopeScaling, original_len: int) -> torch.Tensor:
    """Llama 3.1: long wavelengths divided by `factor`, short ones kept, a smooth ramp between."""
    factor = scaling.factor
    low_freq_wavelen = original_len / scaling.low_freq_factor
    high_freq_wavelen = original_len / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (original_len / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def _yarn(
    pos_freqs: torch.Tensor, scaling: RopeScaling, original_len: int, dim: int, base: float
) -> tuple[torch.Tensor, float]:
    """YaRN: interpolate low frequencies, extrapolate high ones, ramp between; scale cos/sin."""
    factor = scaling.factor
    attention = scaling.attention_factor
    if attention is None:
        attention = 1.0 if factor <= 1 else 0.1 * math.log(factor) + 1.0

    def correction_dim(num_rotations: float) -> float:
        return (dim * math.log(original_len / (num_rotations * 2 * math.pi))) / (2 * math.log(base))

    low = max(math.floor(correction_dim(scaling.beta_fast)), 0)
    high = min(math.ceil(correction_dim(scaling.beta_slow)), dim - 1)
    if low == high:
        high += 0.001  # avoid a zero-width ramp
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    extrapolation_weight = 1 - ramp  # (dim // 2,)
    inv_freq_extrapolation = 1.0 / pos_freqs
    inv_freq_interpolation = 1.0 / (factor * pos_freqs)
    inv_freq = (
        inv_freq_interpolation * (1 - extrapolation_weight)
        + inv_freq_extrapolation * extrapolation_weight
    )
    return inv_freq, float(attention)
