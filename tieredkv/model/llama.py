"""The Llama-family forward pass (Llama, Qwen2, Mistral, SmolLM, Qwen3) over the paged KV pool.

Plain PyTorch: embedding, RMSNorm, RoPE, GQA attention through an `AttentionBackend`, SwiGLU MLP,
head; Qwen3 normalises each query and key head (RMSNorm over head_dim) before RoPE. q/k/v and
gate/up projections are fused into one matmul each; the head runs only on each sequence's last
new token (on every token of the chunks whose prompt logprobs are asked for).
Numerics follow Hugging Face transformers (RMSNorm in fp32, RoPE in the model dtype) so fp32
greedy outputs match it token for token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from tieredkv.errors import ModelLoadError
from tieredkv.model.attention import AttentionBackend
from tieredkv.model.forward_batch import ForwardBatch
from tieredkv.model.linear import Linear, PackedLinear, make_linear, packed_linear_works
from tieredkv.model.pointwise import make_pointwise, rms_norm
from tieredkv.model.rope import build_rope_cache
from tieredkv.model_config import ModelConfig


@dataclass(frozen=True)
class LayerWeights:
    input_norm: torch.Tensor  # (hidden,)
    qkv: Linear  # hidden -> (heads + 2 * kv_heads) * head_dim, with a bias for Qwen2
    o: Linear  # heads * head_dim -> hidden
    post_norm: torch.Tensor  # (hidden,)
    gate_up: Linear  # hidden -> 2 * intermediate
    down: Linear  # intermediate -> hidden
    # Qwen3: the q_norm weight on each query head, k_norm's on each key head; None: no q/k norm
    qk_norm: torch.Tensor | None = None  # (heads + kv_heads, head_dim)


def qk_norm_weight(
    weights: dict[str, torch.Tensor], attn: str, config: ModelConfig
) -> torch.Tensor | None:
    """q_norm's weight repeated for each query head and k_norm's for each key head, side by
    side as `hidden()` holds q and k: (heads + kv_heads, head_dim); None without q/k norms."""
    if f"{attn}q_norm.weight" not in weights:
        return None
    q_norm, k_norm = _take(weights, attn + "q_norm.weight"), _take(weights, attn + "k_norm.weight")
    return torch.cat([q_norm.expand(config.num_heads, -1), k_norm.expand(config.num_kv_heads, -1)])


def _take(weights: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    try:
        return weights[name]
    except KeyError:
        raise ModelLoadError(f"missing tensor {name!r} in the model weights") from None


def fused_projections(
    weights: dict[str, torch.Tensor], prefix: str, packed: bool
) -> tuple[Linear, Linear, Linear, Linear]:
    """Layer `prefix`'s qkv, o, gate_up and down projections, q/k/v and gate/up fused."""
    attn, mlp = prefix + "self_attn.", prefix + "mlp."
    qkv = torch.cat([_take(weights, f"{attn}{p}_proj.weight") for p in "qkv"])
    bias = None
    if f"{attn}q_proj.bias" in weights:
        bias = torch.cat([_take(weights, f"{attn}{p}_proj.bias") for p in "qkv"])
    gate_up = torch.cat(
        [_take(weights, mlp + "gate_proj.weight"), _take(weights, mlp + "up_proj.weight")]
    )
    return (
        make_linear(qkv, bias, packed),
        make_linear(_take(weights, attn + "o_proj.weight"), packed=packed),
        make_linear(gate_up, packed=packed),
        make_linear(_take(weights, mlp + "down_proj.weight"), packed=packed),
    )


def _layer_weights(
    weights: dict[str, torch.Tensor], i: int, packed: bool, config: ModelConfig
) -> LayerWeights:
    prefix = f"model.layers.{i}."
    qkv, o, gate_up, down = fused_projections(weights, prefix, packed)
    return LayerWeights(
        input_norm=_take(weights, prefix + "input_layernorm.weight"),
        qkv=qkv,
        o=o,
        post_norm=_take(weights, prefix + "post_attention_layernorm.weight"),
        gate_up=gate_up,
        down=down,
        qk_norm=qk_norm_weight(weights, prefix + "self_attn.", config),
    )


class LlamaModel:
    """Stateless apart from its weights: the KV lives in the pool behind `attention`."""

    def __init__(
        self,
        config: ModelConfig,
        weights: dict[str, torch.Tensor],
        attention: AttentionBackend,
        max_len: int,
        device: torch.device | str = "cpu",
    ) -> None:
        self.config = config
        self.attention = attention
        self.device = torch.device(device)
        to_device = {name: tensor.to(self.device) for name, tensor in weights.items()}
        embed = _take(to_device, "model.embed_tokens.weight")  # (vocab, hidden)
        self.dtype = embed.dtype
        self.final_norm = _take(to_device, "model.norm.weight")
        packed = packed_linear_works(self.dtype, self.device)
        head = to_device.get("lm_head.weight")  # tied to the embedding when absent
        self.lm_head = make_linear(embed if head is None else head, packed=packed)
        # tied: the embedding's rows are read from the head's copy where it can give them
        tied_rows = head is None and isinstance(self.lm_head, PackedLinear)
        self._embed = None if tied_rows and self.lm_head.gives_rows else embed
        self.layers = self._layers(to_device, packed)
        cos, sin = build_rope_cache(config, max_len, self.device)  # (max_len, head_dim) fp32
        self.cos, self.sin = cos.to(self.dtype), sin.to(self.dtype)
        self.max_len = max_len
        self.pointwise = make_pointwise(config, self.dtype, self.device)

    def _layers(self, weights: dict[str, torch.Tensor], packed: bool) -> list:
        config = self.config
        return [_layer_weights(weights, i, packed, config) for i in range(config.num_layers)]

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        """The embedding's rows (T, hidden) for token ids (T,)."""
        if self._embed is not None:
            return self._embed[token_ids]
        assert isinstance(self.lm_head, PackedLinear), "a tied head in the paired layout"
        return self.lm_head.weight_rows(token_ids)

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        """Forward the batch's new tokens; returns fp32 logits (B, vocab) of each chunk's last."""
        return self.head(self.hidden(batch)[batch.logits_indices])

    @torch.inference_mode()
    def head(self, x: torch.Tensor) -> torch.Tensor:
        """Final norm and LM head: hidden states (R, hidden) -> fp32 logits (R, vocab)."""
        return self.lm_head(rms_norm(x, self.final_norm, self.config.rms_norm_eps)).float()

    @torch.inference_mode()
    def hidden(self, batch: ForwardBatch) -> torch.Tensor:
        """Every new token's hidden state after the last layer (T, hidden)."""
        cfg = self.config
        num_tokens = batch.num_tokens
        q_size, kv_size = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        qk_heads = cfg.num_heads + cfg.num_kv_heads
        self.attention.begin_step(batch)
        cos = self.cos[batch.positions].unsqueeze(1)  # (T, 1, head_dim)
        sin = self.sin[batch.positions].unsqueeze(1)
        x = self.embed(batch.token_ids)  # (T, hidden)
        ops = self.pointwise.for_tokens(num_tokens)
        for layer, w in enumerate(self.layers):
            h = ops.rms_norm(x, w.input_norm, cfg.rms_norm_eps)
            qkv = w.qkv(h)  # (T, q_size + 2 * kv_size)
            # q and k heads side by side: one rotation for both
            qk = qkv[:, : q_size + kv_size].view(num_tokens, qk_heads, cfg.head_dim)
            if w.qk_norm is not None:  # as transformers: normalised in fp32, weighted in dtype
                qk = F.rms_norm(qk, (cfg.head_dim,), None, cfg.rms_norm_eps) * w.qk_norm
            q, k = ops.rope(qk, cos, sin).split([cfg.num_heads, cfg.num_kv_heads], dim=1)
            v = qkv[:, q_size + kv_size :].view(num_tokens, cfg.num_kv_heads, cfg.head_dim)
            attn = self.attention.attend(layer, q, k, v, batch)  # (T, heads, head_dim)
            x = w.o.add_to(x, attn.reshape(num_tokens, q_size))
            h = ops.rms_norm(x, w.post_norm, cfg.rms_norm_eps)
            x = w.down.add_to(x, ops.silu_and_mul(w.gate_up(h)))  # gate_up: (T, 2 * inter)
        return x
