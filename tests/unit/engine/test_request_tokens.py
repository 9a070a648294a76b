"""`Request.packed_tokens`: the prompt packed once, generated tokens appended as they come."""

from tests.support.tiny_cache import make_cache, tiny_layout
from tieredkv.cache.cache_handle import CacheHandle
from tieredkv.cache.tiered_cache import DEFAULT_NAMESPACE
from tieredkv.engine.protocol import GenerationRequest
from tieredkv.engine.request import Request
from tieredkv.model.sampler import SamplingParams


def _request(prompt: tuple[int, ...]) -> Request:
    spec = GenerationRequest("r", prompt, SamplingParams(max_tokens=4))
    kv = CacheHandle(make_cache(tiny_layout(), device_pages=4)[0], DEFAULT_NAMESPACE)
    return Request(spec, seq_id=0, output=None, generator=None, kv=kv)  # type: ignore[arg-type]


def test_packed_tokens_follow_the_outputs() -> None:
    request = _request((11, 12, 13, 40000))
    first = request.packed_tokens
    assert first.ids() == request.tokens == [11, 12, 13, 40000]
    assert request.packed_tokens is first  # nothing new: the same snapshot
    request.output_ids.append(7)
    request.output_ids.extend([8, 9])
    assert request.packed_tokens.ids() == request.tokens == [11, 12, 13, 40000, 7, 8, 9]
    assert len(request.packed_tokens) == request.num_tokens
    assert first.ids() == [11, 12, 13, 40000]  # earlier snapshots stay as they were


def test_token_slice_equals_slicing_the_whole_sequence() -> None:
    request = _request((1, 2, 3, 4, 5))
    request.output_ids.extend([6, 7, 8])
    whole = request.tokens
    for start in range(len(whole) + 1):
        for end in range(start, len(whole) + 2):
            assert request.token_slice(start, end) == whole[start:end], (start, end)
