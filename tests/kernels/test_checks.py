"""Wrappers refuse malformed arguments with a ValueError that names the argument."""

import pytest
import torch
from paged_case import make_case
from tieredkv.kernels import reference


@pytest.fixture(params=["torch", "triton"])
def kernels(request):
    if request.param == "torch":
        return reference
    return request.getfixturevalue("triton_kernels")


@pytest.fixture
def case():
    return make_case([2, 1], [5, 3], num_heads=4, num_kv_heads=2, head_dim=16, page_size=4)


def _prefill_with(case, **changes):
    names = ("q", "k_pages", "v_pages", "page_table", "query_start", "kv_lens", "scale")
    args = dict(zip(names, case.prefill_args(), strict=True))
    args.update(changes)
    return tuple(args.values())


@pytest.mark.parametrize(
    ("name", "make_bad"),
    [
        ("q", lambda c: c.q[:, :, 0]),  # 2-d
        ("q", lambda c: c.q[:, :3]),  # 3 heads over 2 kv heads
        ("q", lambda c: c.q.transpose(1, 2)),  # head_dim not contiguous
        ("k_pages", lambda c: c.k_pages.double()),
        ("k_pages", lambda c: c.k_pages.to("meta")),
        ("v_pages", lambda c: c.v_pages[:, :2]),
        ("page_table", lambda c: c.page_table.float()),
        ("page_table", lambda c: c.page_table[0]),
        ("query_start", lambda c: c.query_start[:2]),
        ("kv_lens", lambda c: c.kv_lens.to("meta")),
        ("kv_lens", lambda c: c.kv_lens[:1]),
    ],
)
def test_prefill_names_the_bad_argument(kernels, case, name, make_bad):
    args = _prefill_with(case, **{name: make_bad(case)})
    with pytest.raises(ValueError, match=rf"^{name}:"):
        kernels.paged_prefill_attention(*args)


def test_decode_wants_one_query_per_sequence(kernels, case):
    q = case.q[:3]  # 3 queries, 2 sequences
    with pytest.raises(ValueError, match=r"^q:"):
        kernels.paged_decode_attention(q, *case.decode_args()[1:])


def test_page_copies_name_the_bad_argument(kernels):
    pool = torch.zeros(2, 2, 6, 4, 2, 8)
    ids = torch.tensor([1, 3])
    staging = torch.zeros(2, 2, 2, 4, 2, 8)
    with pytest.raises(ValueError, match=r"^kv_pool:"):
        kernels.gather_pages(pool[0], ids)
    with pytest.raises(ValueError, match=r"^kv_pool:"):
        kernels.gather_pages(pool.transpose(4, 5), ids)
    with pytest.raises(ValueError, match=r"^page_ids:"):
        kernels.gather_pages(pool, ids.float())
    with pytest.raises(ValueError, match=r"^out:"):
        kernels.gather_pages(pool, ids, out=staging[:1])
    with pytest.raises(ValueError, match=r"^staging:"):
        kernels.scatter_pages(pool, ids, staging.double())
    with pytest.raises(ValueError, match=r"^staging:"):
        kernels.scatter_pages(pool, ids, staging.transpose(4, 5))
