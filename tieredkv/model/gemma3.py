"""The Gemma 3 text forward pass (`Gemma3ForCausalLM`) over the paged KV pool.

Gemma 3 is `LlamaModel`'s shape with its own arithmetic: the embedding scaled by sqrt(hidden)
in the model dtype; RMSNorms that weigh by (1 + w), computed in fp32 and rounded once, four per
layer (around attention and around the MLP, each branch normalised before it joins the
residual) plus one on each query and key head; a GELU-tanh gated MLP; two RoPE tables (the
sliding layers' local base, the global layers' base and scaling), chosen per layer; attention
scaled by `query_pre_attn_scalar` (`ModelConfig.attention_scale`, which the backends apply) over
each layer's window; optionally soft-capped logits. Numerics follow transformers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from tieredkv.model.attention import AttentionBackend
from tieredkv.model.forward_batch import ForwardBatch
from tieredkv.model.linear import Linear
from tieredkv.model.llama import LlamaModel, fused_projections
from tieredkv.model.rope import build_rope_cache
from tieredkv.model_config import ModelConfig


@dataclass(frozen=True)
class GemmaLayerWeights:
    # every norm weight is (1 + w) in fp32, as transformers multiplies it
    input_norm: torch.Tensor  # (hidden,)
    qkv: Linear  # hidden -> (heads + 2 * kv_heads) * head_dim
    qk_norm: torch.Tensor  # (heads + kv_heads, head_dim): q_norm per query head, k_norm per key
    o: Linear  # heads * head_dim -> hidden
    post_attention_norm: torch.Tensor  # (hidden,)
    pre_feedforward_norm: torch.Tensor  # (hidden,)
    gate_up: Linear  # hidden -> 2 * intermediate
    down: Linear  # intermediate -> hidden
    post_feedforward_norm: torch.Tensor  # (hidden,)
    sliding: bool  # the layer attends over a window (and rotates by the local RoPE table)


def gemma_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Gemma's RMSNorm: x / rms(x) * weight in fp32, `weight` already (1 + w) in fp32 and
    broadcast over x's last dims; returns x's dtype. torch's fused norm gives transformers'
    x * rsqrt(mean(x²) + eps) bit for bit in fp32."""
    normed = F.rms_norm(x.float(), (x.shape[-1],), None, eps)
    return (normed * weight).to(x.dtype)


def gelu_tanh_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """(T, 2 * intermediate) -> gelu_tanh(gate) * up, (T, intermediate)."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.gelu(gate, approximate="tanh") * up


class Gemma3Model(LlamaModel):
    """`LlamaModel`'s weights, head and interface; Gemma 3's layers."""

    def __init__(
        self,
        config: ModelConfig,
        weights: dict[str, torch.Tensor],
        attention: AttentionBackend,
        max_len: int,
        device: torch.device | str = "cpu",
    ) -> None:
        super().__init__(config, weights, attention, max_len, device)
        self.final_norm = _one_plus(self.final_norm)
        # the embedding's scale, rounded to the model dtype as transformers rounds it
        self.embed_scale = torch.tensor(config.hidden_size**0.5, dtype=self.dtype)
        cos, sin = build_rope_cache(config, max_len, self.device, sliding=True)
        self.local_cos, self.local_sin = cos.to(self.dtype), sin.to(self.dtype)

    def _layers(self, weights: dict[str, torch.Tensor], packed: bool) -> list:
        cfg = self.config
        layers = []
        for i in range(cfg.num_layers):
            prefix = f"model.layers.{i}."
            qkv, o, gate_up, down = fused_projections(weights, prefix, packed)
            norm = {
                name: _one_plus(weights[f"{prefix}{name}.weight"])
                for name in (
                    "input_layernorm",
                    "post_attention_layernorm",
                    "pre_feedforward_layernorm",
                    "post_feedforward_layernorm",
                    "self_attn.q_norm",
                    "self_attn.k_norm",
                )
            }
            qk_norm = torch.cat(
                [
                    norm["self_attn.q_norm"].expand(cfg.num_heads, -1),
                    norm["self_attn.k_norm"].expand(cfg.num_kv_heads, -1),
                ]
            )
            layers.append(
                GemmaLayerWeights(
                    input_norm=norm["input_layernorm"],
                    qkv=qkv,
                    qk_norm=qk_norm,
                    o=o,
                    post_attention_norm=norm["post_attention_layernorm"],
                    pre_feedforward_norm=norm["pre_feedforward_layernorm"],
                    gate_up=gate_up,
                    down=down,
                    post_feedforward_norm=norm["post_feedforward_layernorm"],
                    sliding=cfg.window_of(i) is not None,
                )
            )
        return layers

    @torch.inference_mode()
    def head(self, x: torch.Tensor) -> torch.Tensor:
        """Final norm, LM head and the soft-cap: hidden states (R, hidden) -> fp32 logits."""
        logits = self.lm_head(gemma_norm(x, self.final_norm, self.config.rms_norm_eps))
        cap = self.config.final_logit_softcapping
        if cap is not None:  # in the model dtype, as transformers caps
            logits = torch.tanh(logits / cap) * cap
        return logits.float()

    @torch.inference_mode()
    def hidden(self, batch: ForwardBatch) -> torch.Tensor:
        """Every new token's hidden state after the last layer (T, hidden)."""
        cfg = self.config
        eps, num_tokens = cfg.rms_norm_eps, batch.num_tokens
        q_size, kv_size = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        qk_heads = cfg.num_heads + cfg.num_kv_heads
        self.attention.begin_step(batch)
        tables = {  # (T, 1, head_dim) each, per layer kind
            False: (self.cos[batch.positions].unsqueeze(1), self.sin[batch.positions].unsqueeze(1)),
            True: (
                self.local_cos[batch.positions].unsqueeze(1),
                self.local_sin[batch.positions].unsqueeze(1),
            ),
        }
        x = self.embed(batch.token_ids) * self.embed_scale  # (T, hidden)
        rope = self.pointwise.for_tokens(num_tokens).rope
        for layer, w in enumerate(self.layers):
            qkv = w.qkv(gemma_norm(x, w.input_norm, eps))  # (T, q_size + 2 * kv_size)
            qk = qkv[:, : q_size + kv_size].view(num_tokens, qk_heads, cfg.head_dim)
            q, k = rope(gemma_norm(qk, w.qk_norm, eps), *tables[w.sliding]).split(
                [cfg.num_heads, cfg.num_kv_heads], dim=1
            )
            v = qkv[:, q_size + kv_size :].view(num_tokens, cfg.num_kv_heads, cfg.head_dim)
            attn = self.attention.attend(layer, q, k, v, batch)  # (T, heads, head_dim)
            x = x + gemma_norm(w.o(attn.reshape(num_tokens, q_size)), w.post_attention_norm, eps)
            h = gemma_norm(x, w.pre_feedforward_norm, eps)
            mlp = w.down(gelu_tanh_and_mul(w.gate_up(h)))  # gate_up: (T, 2 * inter)
            x = x + gemma_norm(mlp, w.post_feedforward_norm, eps)
        return x


def _one_plus(weight: torch.Tensor) -> torch.Tensor:
    return 1.0 + weight.float()
