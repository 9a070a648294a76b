"""Triton page gather/scatter against the torch reference: bytes equal, others untouched."""

import pytest
import torch
from tieredkv.kernels import reference

# (layers, page_size, kv_heads, head_dim): a run of 16 * 2 * 64 = 2048 elements spans two
# programs of the kernel's 1024-element blocks; 4 * 3 * 8 = 96 is one masked block.
SHAPES = [(3, 4, 3, 8), (2, 16, 2, 64)]


def make_pool(shape, dtype, device, num_pages=10, seed=0) -> torch.Tensor:
    layers, page_size, kv_heads, head_dim = shape
    generator = torch.Generator().manual_seed(seed)
    pool = torch.randn((layers, 2, num_pages, page_size, kv_heads, head_dim), generator=generator)
    return pool.to(dtype).to(device)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gather_matches_reference(triton_kernels, device, shape, dtype):
    pool = make_pool(shape, dtype, device)
    page_ids = torch.tensor([7, 2, 9, 0, 5], dtype=torch.int32)  # shuffled, on the host
    staging = triton_kernels.gather_pages(pool, page_ids)
    assert torch.equal(staging, reference.gather_pages(pool, page_ids))
    out = torch.zeros_like(staging)
    assert triton_kernels.gather_pages(pool, page_ids.to(device), out=out) is out
    assert torch.equal(out, staging)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_scatter_matches_reference_and_leaves_other_pages(triton_kernels, device, shape, dtype):
    pool = make_pool(shape, dtype, device)
    page_ids = torch.tensor([3, 8, 1], dtype=torch.int64, device=device)
    staging = reference.gather_pages(make_pool(shape, dtype, device, seed=1), page_ids)
    expected = pool.clone()
    reference.scatter_pages(expected, page_ids, staging)
    triton_kernels.scatter_pages(pool, page_ids, staging)
    assert torch.equal(pool, expected)
    assert torch.equal(triton_kernels.gather_pages(pool, page_ids), staging)


def test_scatter_into_a_pool_view(triton_kernels, device):
    # A pool that is a slice of a bigger tensor (strided on the page axis) still moves pages.
    big = make_pool((2, 4, 2, 8), torch.float32, device, num_pages=20)
    pool = big[:, :, ::2]  # every other page
    page_ids = torch.tensor([4, 0], device=device)
    staging = torch.randn(2, 2, 2, 4, 2, 8, device=device)
    triton_kernels.scatter_pages(pool, page_ids, staging)
    assert torch.equal(big[:, :, 8], staging[0]) and torch.equal(big[:, :, 0], staging[1])
    assert torch.equal(triton_kernels.gather_pages(pool, page_ids), staging)


def test_no_pages_is_a_no_op(triton_kernels, device):
    pool = make_pool((2, 4, 2, 8), torch.float32, device)
    empty = torch.zeros(0, dtype=torch.int32)
    assert triton_kernels.gather_pages(pool, empty).shape == (0, 2, 2, 4, 2, 8)
    before = pool.clone()
    triton_kernels.scatter_pages(pool, empty, torch.zeros(0, 2, 2, 4, 2, 8, device=device))
    assert torch.equal(pool, before)
