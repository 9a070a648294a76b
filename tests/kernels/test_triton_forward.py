"""A tiny model's forward through the Triton kernels equals the torch reference path (fp32).

The default model's attention shapes (9 heads over 3 kv heads, head_dim 64, pages of 16) on a
random 2-layer model: a prefill, a chunk after its own prefix, a second sequence that reuses the
first one's pages as a cached prefix, then batched decode steps. Interpreted on CPU, compiled on
CUDA.
"""

from collections.abc import Callable

import pytest
import torch

from tests.model_factory import make_tiny_model_dir
from tieredkv.cache.pools.device_pool import DevicePool
from tieredkv.model.loader import LoadedModel, load_model
from tieredkv.model.runner import ModelRunner, PagedSequence

PAGE_SIZE = 16
DECODE_STEPS = 3


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    model_dir = make_tiny_model_dir(
        tmp_path_factory.mktemp("triton-forward"),
        hidden_size=576, num_heads=9, num_kv_heads=3, intermediate_size=128,
    )  # fmt: skip
    model = load_model(model_dir, dtype=torch.float32)
    assert (model.config.num_heads, model.config.num_kv_heads, model.config.head_dim) == (9, 3, 64)
    return model


def run_script(
    runner: ModelRunner, after_prefill: Callable[[DevicePool], None] | None = None
) -> tuple[torch.Tensor, list[list[int]]]:
    """Every forward's logits, stacked (forwards, vocab), and each sequence's greedy tokens.
    `after_prefill` is called with the pool once the first sequence's prompt is computed."""
    pool = runner.pool
    prompt = torch.randint(3, 300, (45,), generator=torch.Generator().manual_seed(1)).tolist()
    a = PagedSequence(0, list(prompt))
    logits = [runner.forward([a.next_chunk(pool, 20)])]  # prefill: 20 tokens over two pages
    logits.append(runner.forward([a.next_chunk(pool)]))  # the other 25 after that prefix
    if after_prefill is not None:
        after_prefill(pool)
    # b's first 32 tokens are a's: it points at a's first two pages and computes only its suffix
    b = PagedSequence(1, [*prompt[:32], 5, 6, 7, 8, 9], kv_len=32, page_ids=a.page_ids[:2])
    logits.append(runner.forward([b.next_chunk(pool)]))
    last = torch.cat(logits[1:])  # (2, vocab): a's and b's next-token logits
    outputs: list[list[int]] = [[], []]
    for _ in range(DECODE_STEPS):  # decode-only batches of both sequences
        for seq, out, row in zip((a, b), outputs, last, strict=True):
            out.append(int(row.argmax()))
            seq.token_ids.append(out[-1])
        last = runner.forward([a.next_chunk(pool), b.next_chunk(pool)])
        logits.append(last)
    return torch.cat(logits), outputs


def make_runner(model: LoadedModel, backend: str, device: torch.device) -> ModelRunner:
    return ModelRunner.create(
        model.config, model.weights, num_pages=16, page_size=PAGE_SIZE, max_model_len=128,
        device=device, attention_backend=backend,
    )  # fmt: skip


def test_forward_through_triton_equals_torch(triton_kernels, device, tiny_model):
    torch_runner = make_runner(tiny_model, "torch", device)
    triton_runner = make_runner(tiny_model, "triton", device)
    assert triton_runner.attention.kernels.name == "triton"
    expected_logits, expected_tokens = run_script(torch_runner)
    logits, tokens = run_script(triton_runner)
    assert logits.shape == (3 + 2 * DECODE_STEPS, tiny_model.config.vocab_size)
    torch.testing.assert_close(logits, expected_logits, atol=1e-4, rtol=1e-4)
    assert tokens == expected_tokens
