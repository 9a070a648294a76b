"""The architecture of a served model: `ModelConfig` (read from a Hugging Face config by
`tieredkv.model.hf_config`) and its RoPE scaling (`RopeScaling`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from tieredkv.errors import ConfigError


@dataclass(frozen=True)
class RopeScaling:
    """RoPE frequency scaling that does not depend on the sequence length.

    kind: "default", "linear", "llama3" or "yarn". Length-dependent variants (dynamic NTK,
    longrope) are refused at load time because a page's KV must depend only on its prefix.
    """

    kind: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0  # llama3
    high_freq_factor: float = 4.0  # llama3
    original_max_position_embeddings: int = 0  # llama3, yarn
    beta_fast: float = 32.0  # yarn
    beta_slow: float = 1.0  # yarn
    attention_factor: float | None = None  # yarn; None: 0.1 * ln(factor) + 1

    def __post_init__(self) -> None:
        if self.kind not in ("default", "linear", "llama3", "yarn"):
            raise ConfigError(f"RopeScaling.kind: unsupported {self.kind!r}")
        if self.factor <= 0:
            raise ConfigError(f"RopeScaling.factor must be > 0, got {self.factor}")


@dataclass(frozen=True)
class ModelConfig:
    """The architecture of a decoder: the Llama family (Llama, Qwen2, Mistral, SmolLM), Qwen3
    (Llama with q/k RMSNorm) and Gemma 3 (`architecture` "gemma3_text")."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling = field(default_factory=RopeScaling)
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # Qwen2: q/k/v projections carry a bias
    architecture: str = "llama"
    # Per layer: None = full causal attention; W = a sliding window (the query at position p
    # attends keys at positions p - W < j <= p, as transformers' `sliding_window`). Empty: every
    # layer full.
    layer_windows: tuple[int | None, ...] = ()
    # Gemma: attention scores are scaled by 1/sqrt(this) instead of 1/sqrt(head_dim).
    query_pre_attn_scalar: float | None = None
    # Gemma 3: the RoPE base of the sliding layers (None: rope_theta, scaled as every layer's)
    rope_local_theta: float | None = None
    # Gemma: logits are soft-capped to (-cap, cap) by cap * tanh(logits / cap) (None: off)
    final_logit_softcapping: float | None = None

    def __post_init__(self) -> None:
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "head_dim",
            "max_position_embeddings",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ConfigError(f"ModelConfig.{name} must be a positive int, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(
                f"ModelConfig.num_heads ({self.num_heads}) must be a multiple of "
                f"num_kv_heads ({self.num_kv_heads})"
            )
        if self.head_dim % 2:
            raise ConfigError(f"ModelConfig.head_dim must be even for RoPE, got {self.head_dim}")
        if self.layer_windows and len(self.layer_windows) != self.num_layers:
            raise ConfigError(
                f"ModelConfig.layer_windows has {len(self.layer_windows)} entries for "
                f"{self.num_layers} layers"
            )
        for name in ("query_pre_attn_scalar", "rope_local_theta", "final_logit_softcapping"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ConfigError(f"ModelConfig.{name} must be > 0 or None, got {value!r}")
        for window in self.layer_windows:
            if window is not None and (not isinstance(window, int) or window <= 0):
                raise ConfigError(f"ModelConfig.layer_windows: {window!r} is not a positive int")

    def window_of(self, layer: int) -> int | None:
        """Layer `layer`'s sliding window in tokens, or None for full attention."""
        return self.layer_windows[layer] if self.layer_windows else None

    @property
    def attention_scale(self) -> float:
        """The softmax scale of attention scores: 1/sqrt(query_pre_attn_scalar or head_dim)."""
        return (self.query_pre_attn_scalar or self.head_dim) ** -0.5

    @property
    def has_sliding_layers(self) -> bool:
        return any(window is not None for window in self.layer_windows)

    @property
    def num_queries_per_kv(self) -> int:
        return self.num_heads // self.num_kv_heads
