"""benchmarks/disk_overlap.py's promotion work on a tiny layout: every read path lands the
records' bytes intact in both layouts (the real run forwards the default model, too slow for
the suite; never a timed assertion)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from benchmarks.disk_overlap import PromotionWork, measure, overlapped_s
from tieredkv.cache.page_layout import PageLayout

LAYOUT = PageLayout(num_layers=6, num_kv_heads=2, head_dim=64, page_size=16, dtype=torch.bfloat16)


@pytest.fixture
def work(tmp_path: Path):
    work = PromotionWork(LAYOUT, num_pages=8, directory=tmp_path, seed=1)
    yield work
    work.close()
    assert list(tmp_path.iterdir()) == []  # the records file is gone


def test_serial_read_lands_every_page_in_both_layouts(work: PromotionWork) -> None:
    assert not work.landed_intact()  # nothing landed yet
    assert work.read_chunked(land=False) > 0
    assert not work.landed_intact()  # a raw read copies nothing
    work.read_chunked(land=True)
    assert work.landed_intact()


@pytest.mark.parametrize("groups", [2, 3, 6])
def test_grouped_read_lands_each_group_in_order(work: PromotionWork, groups: int) -> None:
    ready = work.read_grouped(groups)
    assert len(ready) == groups and ready == sorted(ready)
    assert work.landed_intact()


def test_overlapped_ttft_waits_for_a_late_group() -> None:
    assert overlapped_s(0.060, [0.0, 0.0]) == 0.060  # reads done: the forward alone
    # group 1's layers start at 30 ms but wait for it until 50 ms, then run 30 ms
    assert overlapped_s(0.060, [0.010, 0.050]) == pytest.approx(0.080)
    assert overlapped_s(0.060, [0.020, 0.020]) == pytest.approx(0.080)  # group 0 late


def test_measure_reports_every_figure(work: PromotionWork) -> None:
    figures = measure(work, lambda: 0.001, groups=2, repeats=2)  # a forward that "took" 1 ms
    assert figures["forward"]["median_ms"] == pytest.approx(1.0)
    for name, f in figures.items():
        assert f["min_ms"] <= f["median_ms"] <= f["max_ms"], name
        assert f["min_ms"] > 0, name
    serial = figures["serial ttft"]["median_ms"]
    assert serial == pytest.approx(figures["serial read"]["median_ms"] + 1.0)
    assert work.landed_intact()
