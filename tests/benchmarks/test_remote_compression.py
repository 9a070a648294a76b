"""benchmarks/remote_compression.py's figures on tiny synthetic pages (the real run prefills
the default model, too slow for the suite)."""

from __future__ import annotations

import numpy as np

from benchmarks.remote_compression import codec_figures


def test_codec_figures_on_tiny_pages() -> None:
    rng = np.random.default_rng(0)
    noise = [rng.integers(0, 256, 4096, dtype=np.uint8).tobytes() for _ in range(2)]
    zeros = [bytes(4096)] * 2
    noisy, flat = codec_figures(noise, repeats=2), codec_figures(zeros, repeats=2)
    assert noisy["pages"] == 2 and noisy["page_bytes"] == 4096
    assert noisy["ratio"] < 1.0 < 10 < flat["ratio"]
    for figures in (noisy, flat):
        assert figures["comp_min"] <= figures["comp"] <= figures["comp_max"]
        assert figures["dec_min"] <= figures["dec"] <= figures["dec_max"]
        assert figures["copy"] > 0
