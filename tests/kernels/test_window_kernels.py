"""Sliding-window attention in the reference and Triton kernels, against dense attention.

Every key a window hides from all of a sequence's queries is NaN in the pool: a kernel that
reads one (a sliding layer's older pages may be gone) turns its output into NaN.
"""

import pytest
import torch
from paged_case import LAYER, PagedCase, make_case, naive_attention
from tieredkv.kernels import reference

# prompts longer than the window, a chunk crossing it, a chunk after a long prefix, q_len 1
Q_LENS = [40, 9, 20, 1, 3]
KV_LENS = [40, 45, 70, 64, 3]
DECODE_KV_LENS = [1, 7, 17, 45, 70]
HEADS = [(2, 2, 16), (6, 2, 16)]


def poison_outside_windows(case: PagedCase, q_lens: list[int], window: int) -> PagedCase:
    """NaN over each sequence's keys older than its first query's window."""
    page_size = case.kv_pool.shape[3]
    for i, (q_len, kv_len) in enumerate(zip(q_lens, case.kv_lens.tolist(), strict=True)):
        for n in range(max(0, kv_len - q_len - window + 1)):
            page = int(case.page_table[i, n // page_size])
            case.kv_pool[LAYER, :, page, n % page_size] = float("nan")
    return case


def tolerance(dtype: torch.dtype) -> dict:
    return {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}


@pytest.mark.parametrize("window", [1, 5, 16, 33, 100])
@pytest.mark.parametrize("page_size", [4, 16])
def test_reference_prefill_honours_the_window(window, page_size) -> None:
    case = make_case(Q_LENS, KV_LENS, num_heads=6, num_kv_heads=2, head_dim=16,
                     page_size=page_size)  # fmt: skip
    case = poison_outside_windows(case, Q_LENS, window)
    out = reference.paged_prefill_attention(*case.prefill_args(), window=window)
    assert not out.isnan().any()
    torch.testing.assert_close(out, naive_attention(case, Q_LENS, window), atol=1e-5, rtol=1e-5)


def test_reference_decode_honours_the_window() -> None:
    q_lens = [1] * len(DECODE_KV_LENS)
    case = make_case(q_lens, DECODE_KV_LENS, num_heads=4, num_kv_heads=2, head_dim=16,
                     page_size=4)  # fmt: skip
    case = poison_outside_windows(case, q_lens, 16)
    out = reference.paged_decode_attention(*case.decode_args(), window=16)
    torch.testing.assert_close(out, naive_attention(case, q_lens, 16), atol=1e-5, rtol=1e-5)


def test_a_window_longer_than_every_sequence_is_full_attention() -> None:
    case = make_case(Q_LENS, KV_LENS, num_heads=4, num_kv_heads=2, head_dim=16, page_size=8)
    full = reference.paged_prefill_attention(*case.prefill_args())
    windowed = reference.paged_prefill_attention(*case.prefill_args(), window=max(KV_LENS))
    assert torch.equal(full, windowed)


@pytest.mark.parametrize("window", [0, -3, True])
def test_a_window_is_a_positive_token_count(window) -> None:
    case = make_case([1], [4], num_heads=2, num_kv_heads=2, head_dim=16, page_size=4)
    with pytest.raises(ValueError, match="window"):
        reference.paged_prefill_attention(*case.prefill_args(), window=window)


@pytest.mark.parametrize("window", [5, 16, 33])
@pytest.mark.parametrize(("num_heads", "num_kv_heads", "head_dim"), HEADS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_prefill_honours_the_window(
    triton_kernels, device, window, num_heads, num_kv_heads, head_dim, dtype
) -> None:
    case = make_case(Q_LENS, KV_LENS, num_heads=num_heads, num_kv_heads=num_kv_heads,
                     head_dim=head_dim, page_size=4, dtype=dtype)  # fmt: skip
    case = poison_outside_windows(case, Q_LENS, window)
    case = _to(case, device)
    out = triton_kernels.paged_prefill_attention(
        *case.prefill_args(), window, block_m=16, block_n=16
    )
    expected = reference.paged_prefill_attention(*case.prefill_args(), window=window)
    assert out.dtype == dtype and not out.isnan().any()
    torch.testing.assert_close(out, expected, **tolerance(dtype))


@pytest.mark.parametrize("window", [1, 16, 40])
@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_decode_honours_the_window(
    triton_kernels, device, window, num_splits, dtype
) -> None:
    q_lens = [1] * len(DECODE_KV_LENS)
    case = make_case(q_lens, DECODE_KV_LENS, num_heads=6, num_kv_heads=2, head_dim=16,
                     page_size=4, dtype=dtype)  # fmt: skip
    case = _to(poison_outside_windows(case, q_lens, window), device)
    out = triton_kernels.paged_decode_attention(
        *case.decode_args(), window, num_splits=num_splits, block_n=16
    )
    expected = reference.paged_decode_attention(*case.decode_args(), window=window)
    assert out.dtype == dtype and not out.isnan().any()
    torch.testing.assert_close(out, expected, **tolerance(dtype))


def _to(case: PagedCase, device: torch.device) -> PagedCase:
    """The case on the Triton tests' device (its builder poisons on CPU)."""
    return PagedCase(
        q=case.q.to(device),
        kv_pool=case.kv_pool.to(device),
        page_table=case.page_table.to(device),
        query_start=case.query_start.to(device),
        kv_lens=case.kv_lens.to(device),
        keys=[k.to(device) for k in case.keys],
        values=[v.to(device) for v in case.values],
        scale=case.scale,
    )


def test_a_sliding_window_model_through_triton_matches_transformers(
    triton_kernels, device, tmp_path
) -> None:
    """A tiny Mistral with a 32-token window, prompt of 80 in chunks of 40, then decodes:
    greedy tokens equal transformers' (fp32, eager, recomputed each step)."""
    import transformers

    from tests.model_factory import make_tiny_model_dir
    from tests.support.greedy import generate_greedy
    from tieredkv.model.loader import load_model
    from tieredkv.model.runner import ModelRunner

    model_dir = make_tiny_model_dir(tmp_path, "mistral", init_std=0.5, sliding_window=32)
    model = load_model(model_dir, dtype=torch.float32)
    runner = ModelRunner.create(
        model.config, model.weights, num_pages=16, page_size=16, max_model_len=128,
        device=device, attention_backend="triton",
    )  # fmt: skip
    prompt = torch.randint(3, 300, (80,), generator=torch.Generator().manual_seed(3)).tolist()
    ours = generate_greedy(runner, prompt, 4, prefill_chunk=40)
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    tokens = list(prompt)
    with torch.no_grad():
        for _ in range(4):
            tokens.append(int(hf(torch.tensor([tokens]), use_cache=False).logits[0, -1].argmax()))
    assert ours == tokens[len(prompt) :]
