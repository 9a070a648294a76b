"""Start-up checks and the model's warm-up, before the server reports healthy."""

from __future__ import annotations

import logging
import time

from tieredkv.cache.page_layout import PageLayout
from tieredkv.cache.tiered_cache import TieredCache
from tieredkv.config import CacheConfig
from tieredkv.errors import ConfigError
from tieredkv.model.forward_batch import SequenceChunk
from tieredkv.model.pointwise import FusedPointwise
from tieredkv.model.runner import ModelRunner

logger = logging.getLogger(__name__)

_WARMUP_TOKENS = 256  # past FUSED_MIN_TOKENS (the fused ops compile here) and the split path
# eager ops on a CPU compile nothing and create no per-shape kernels: a short prefill, a chunk
# after it and a decode create the thread pools and the allocator's first blocks, which a
# longer warm-up would only make every start wait for
_EAGER_CPU_WARMUP_TOKENS = 32


def check_device_capacity(config: CacheConfig, layout: PageLayout, max_model_len: int) -> None:
    """The device tier must hold one whole --max-model-len sequence."""
    pages_needed = -(-max_model_len // layout.page_size)
    pages = config.device_cache_bytes // layout.page_bytes
    if pages < pages_needed:
        raise ConfigError(
            f"--device-cache-size {config.device_cache_bytes} B holds {pages} pages of "
            f"{layout.page_bytes} B, but one --max-model-len {max_model_len} sequence needs "
            f"{pages_needed} ({pages_needed * layout.page_bytes} B)"
        )


def warm_up(runner: ModelRunner, cache: TieredCache) -> None:
    """Run a prefill, a chunk after it and a decode step, so that first requests do not pay
    for lazy initialisation."""
    start = time.perf_counter()
    model = runner.model
    eager_cpu = model.device.type == "cpu" and not isinstance(model.pointwise, FusedPointwise)
    wanted = _EAGER_CPU_WARMUP_TOKENS if eager_cpu else _WARMUP_TOKENS
    length = max(1, min(wanted, (runner.max_model_len - 1) // 2))  # the device holds it
    num_pages = -(-(2 * length + 1) // runner.page_size)
    pages = cache.allocate(num_pages)
    if pages is None:
        raise ConfigError("the device tier has no free page for the warm-up")
    seq_id = -1  # never a request's
    try:
        tokens = list(range(1, length + 1))
        runner.forward([SequenceChunk(seq_id, tokens, 0, pages)])
        runner.forward([SequenceChunk(seq_id, tokens, length, pages)])
        runner.forward([SequenceChunk(seq_id, [1], 2 * length, pages)])
    finally:
        runner.release(seq_id)
        cache.free(pages)
    logger.info("warm-up done in %.2f s", time.perf_counter() - start)
