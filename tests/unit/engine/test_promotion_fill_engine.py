"""Through the engine, a history promoted from disk is copied into its sequence's workspace as
its pages land (test_engine's disk test checks every page landed): a page that fails
verification, or a request that ends while promoting, leaves nothing behind to be served."""

from __future__ import annotations

import torch

from tests.unit.engine.conftest import PAGE_SIZE, prompt, pushed_to_disk
from tests.unit.engine.test_engine import reference_outputs
from tieredkv.cache.index.page_key import page_key
from tieredkv.cache.page_record import PageRecord
from tieredkv.cache.tier import Tier
from tieredkv.engine.protocol import FinishReason
from tieredkv.engine.request import RequestStatus


def fills(harness):
    attention = harness.engine.runner.attention
    assert attention._promotion_fills is not None, "the CPU path has an arena"
    return attention._promotion_fills


def test_a_page_failing_verification_is_recomputed_not_taken_from_the_slot(
    make_harness,
) -> None:
    history = prompt(60, seed=61)
    expected = reference_outputs(make_harness, {"again": [*history, 7, 8]}, max_tokens=6)
    harness = pushed_to_disk(make_harness, history)
    disk = harness.cache.pools.disk
    node = harness.cache.match(history, "").disk.nodes[0]
    index = node.num_pages // 2
    slot, tokens = node.residence.copies[Tier.DISK][index], node.page_ids(index, PAGE_SIZE)
    record = PageRecord(page_key(b"other chain" * 2, tokens), b"other chain" * 2, tokens)
    layout = harness.cache.device_pool.layout
    disk.write_pages([slot], [record], torch.zeros((1, *layout.page_shape), dtype=layout.dtype))
    harness.submit("again", [*history, 7, 8], max_tokens=6)
    harness.run()
    assert harness.tokens("again") == expected["again"]
    assert sum(harness.cache.disk_page_errors().values()) > 0  # seen, recomputed


def test_a_request_ending_while_its_history_is_read_frees_its_slot(make_harness) -> None:
    history = prompt(60, seed=62)
    expected = reference_outputs(make_harness, {"later": [*history, 9]}, max_tokens=4)
    harness = pushed_to_disk(make_harness, history)
    harness.auto_complete = False
    harness.submit("gone", [*history, 7, 8], max_tokens=6)
    for _ in range(20):  # reads towards the device are held back; demotions complete
        harness.step()
        for ticket in harness.executor.pending():
            if ticket.dst_tier is not Tier.DEVICE:
                harness.executor.complete(ticket)
    promoting = harness.engine.scheduler.queued(RequestStatus.PROMOTING)
    assert [r.request_id for r in promoting] == ["gone"]
    assert len(fills(harness)) == 1  # its slot reserved while it waits
    harness.engine.abort("gone")
    harness.auto_complete = True
    harness.run()
    assert harness.outputs["gone"][-1].finish_reason is FinishReason.ABORT
    assert len(fills(harness)) == 0 and harness.engine.runner.attention.num_workspaces == 0
    harness.submit("later", [*history, 9], max_tokens=4)
    harness.run()
    assert harness.tokens("later") == expected["later"]
