"""Pages lent to requests come back in batches; a page that was not lent is refused."""

import pytest

from tests.support.tiny_cache import make_cache, tiny_layout


def test_freeing_a_page_not_lent_is_refused_and_changes_nothing() -> None:
    cache, _ = make_cache(tiny_layout(), device_pages=8)
    pages = cache.allocate(4)
    assert pages is not None
    for bad in ([pages[0], 7], [pages[1], pages[1]]):
        with pytest.raises(AssertionError):
            cache.index.reclaim(bad)
        assert cache.index.private_pages == set(pages) and cache.check_integrity().ok
    cache.free(pages[:3])
    assert cache.index.private_pages == {pages[3]} and cache.check_integrity().ok
