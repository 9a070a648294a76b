import pytest

from tests.support.tiny_cache import tiny_layout
from tieredkv.cache.pools.host_pool import HostPool
from tieredkv.errors import OutOfPagesError


def test_host_pool_is_page_major_with_a_free_list() -> None:
    layout = tiny_layout()
    pool = HostPool.from_bytes(layout, 3 * layout.page_bytes + 10)
    assert pool.enabled and pool.num_pages == 3 and pool.capacity_bytes == 3 * layout.page_bytes
    assert tuple(pool.kv.shape) == (3, *layout.page_shape)
    assert pool.kv[0].is_contiguous() and not pool.pinned  # CPU-only machine
    pages = pool.alloc(2)
    assert pages == [0, 1] and pool.num_free == 1 and pool.used_pages() == [0, 1]
    with pytest.raises(OutOfPagesError):
        pool.alloc(2)
    assert pool.num_free == 1  # all or nothing
    pool.free(pages)
    assert pool.num_free == 3 and pool.is_free(0)


def test_zero_capacity_disables_the_host_tier() -> None:
    pool = HostPool.from_bytes(tiny_layout(), 0)
    assert not pool.enabled and pool.num_free == 0 and pool.capacity_bytes == 0
