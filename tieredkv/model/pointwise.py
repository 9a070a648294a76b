"""A layer's elementwise work: RMSNorm, RoPE on q and k, SiLU-and-multiply; eager or fused.

Eager, each is a chain of torch ops, and each op reads and writes the whole activation: for a
long bf16 prefill on CPU they cost as much as the layer's matmuls. `FusedPointwise` compiles
each into one loop with inductor (its CPU backend, through gcc), once, for every token count
(dynamic shapes). Below `FUSED_MIN_TOKENS` the eager chain is faster than a compiled call's
overhead, so decode steps stay eager. Only the CPU bf16 path fuses: CUDA has its own kernels,
and fp32 stays eager so its outputs keep matching transformers' token for token.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
import torch.nn.functional as F

from tieredkv.model.cpu_kernels import load_cpu_kernels
from tieredkv.model.dtype import cpu_flags
from tieredkv.model.rope import apply_rope
from tieredkv.model_config import ModelConfig

log = logging.getLogger(__name__)

FUSED_MIN_TOKENS = 128  # measured: fused loses below ~64 tokens a step, wins from ~256


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm; torch's fused kernel accumulates in fp32 like transformers' upcast."""
    return F.rms_norm(x, weight.shape, weight, eps)


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """(T, 2 * intermediate) -> silu(gate) * up, (T, intermediate)."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


class Pointwise:
    """The eager ops; `FusedPointwise` swaps in compiled ones for long steps."""

    def __init__(self) -> None:
        self.rms_norm: Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor] = rms_norm
        self.rope: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] = apply_rope
        self.silu_and_mul: Callable[[torch.Tensor], torch.Tensor] = silu_and_mul

    def for_tokens(self, num_tokens: int) -> Pointwise:
        return self


class FusedPointwise(Pointwise):
    """Compiled ops for steps of at least FUSED_MIN_TOKENS tokens, eager ones below."""

    def __init__(self, eager: Pointwise | None = None) -> None:
        super().__init__()
        self._eager = eager or Pointwise()
        self.rms_norm = torch.compile(rms_norm, dynamic=True)
        self.rope = torch.compile(apply_rope, dynamic=True)
        self.silu_and_mul = torch.compile(silu_and_mul, dynamic=True)

    def for_tokens(self, num_tokens: int) -> Pointwise:
        return self if num_tokens >= FUSED_MIN_TOKENS else self._eager


def make_pointwise(config: ModelConfig, dtype: torch.dtype, device: torch.device) -> Pointwise:
    """Fused on a CPU in bf16 when inductor builds there (compiled now, on the model's shapes:
    seconds, cached on disk across starts), else eager. Short bf16 steps on a CPU without AMX
    normalise, rotate and gate in C (`cpu_kernels`): one call instead of torch's eight ops on a
    576-wide row for RMSNorm, five for RoPE, three for SiLU-and-multiply (RoPE and SiLU equal to
    torch's bit for bit in the tests; RMSNorm's fp32 sum may move a rare value by a bf16 step)."""
    if device.type != "cpu" or dtype != torch.bfloat16:
        return Pointwise()
    eager = Pointwise()
    if "amx_bf16" not in cpu_flags() and (kernels := load_cpu_kernels()) is not None:
        eager.rms_norm = kernels.rms_norm
        eager.rope = kernels.rope
        eager.silu_and_mul = kernels.silu_and_mul
    tokens, dim = FUSED_MIN_TOKENS, config.head_dim
    try:
        fused = FusedPointwise(eager)
        x = torch.ones(tokens, config.hidden_size, dtype=dtype)
        fused.rms_norm(x, torch.ones(config.hidden_size, dtype=dtype), config.rms_norm_eps)
        qk = torch.ones(tokens, config.num_heads + config.num_kv_heads, dim, dtype=dtype)
        cos = torch.ones(tokens, 1, dim, dtype=dtype)
        fused.rope(qk, cos, cos)
        fused.silu_and_mul(torch.ones(tokens, 2 * config.intermediate_size, dtype=dtype))
    except Exception as error:
        log.warning("fused elementwise ops unavailable (%s); running them eager", error)
        return eager
    return fused
