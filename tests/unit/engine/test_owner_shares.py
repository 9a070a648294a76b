"""Fair seats by owner, on the scheduler over a real tiered cache (`test_scheduler`'s rig): a
tenant's request joins a batch whose seats another tenant's sequences hold, takes a seat of its
own every step, and the owner running the most sequences is the one preempted."""

from __future__ import annotations

from tests.unit.engine.test_scheduler import make_rig, planned, prompt
from tieredkv.engine.owner_shares import SeatShares, preemption_victim, round_robin
from tieredkv.tenants import tenant_namespace

ALICE = tenant_namespace("alice")
ALICE_SALTED = tenant_namespace("alice", "salt")  # the same owner as ALICE
BOB = tenant_namespace("bob")


def test_a_request_of_an_owner_below_its_share_joins_a_full_batch() -> None:
    rig = make_rig(device_pages=64, max_num_seqs=4)
    wide = [rig.request(f"a{i}", prompt(6, 100 * i), ALICE) for i in range(4)]
    rig.step()  # four prompts computed: four decoding sequences hold every seat
    short = rig.request("b", prompt(6, 900), BOB)
    # bob's share is 2 of 4 seats and alice holds 4: a seat is held back for him
    assert planned(rig.step()) == [("a0", 6, 1), ("a1", 6, 1), ("a2", 6, 1), ("b", 0, 6)]
    # then the seats go round-robin: alice's oldest, bob, alice's next ones
    assert planned(rig.step()) == [("a0", 7, 1), ("b", 6, 1), ("a1", 7, 1), ("a2", 7, 1)]
    assert short.num_preemptions == 0 and all(r.num_preemptions == 0 for r in wide)


def test_one_owner_keeps_the_batch_order() -> None:
    rig = make_rig(device_pages=64, max_num_seqs=4)
    for i in range(4):
        rig.request(f"a{i}", prompt(6, 100 * i), ALICE if i % 2 else ALICE_SALTED)
    rig.step()
    late = rig.request("a4", prompt(6, 900), ALICE)
    assert [r for r, _, _ in planned(rig.step())] == ["a0", "a1", "a2", "a3"]
    assert late in rig.waiting()  # a salt is the same owner: no seat is owed


def test_the_owner_running_the_most_gives_up_its_youngest_sequence() -> None:
    rig = make_rig(device_pages=64, max_num_seqs=8)
    a0, a1, a2 = (rig.request(f"a{i}", prompt(6, 100 * i), ALICE) for i in range(3))
    b = rig.request("b", prompt(6, 900), BOB)
    rig.step()
    running = rig.running()
    assert running == [a0, a1, a2, b]
    assert preemption_victim(running, [a0]) is a2  # not b, the youngest overall
    assert preemption_victim(running, [a0, a1, a2]) is b
    assert preemption_victim(running, running) is None
    assert round_robin(running) == [a0, b, a1, a2]
    shares = SeatShares(running, [], max_num_seqs=4)  # two owners: two seats each
    assert shares.above_share(running) == [a0, a1, a2]
    assert shares.below_share(b)  # one of its two seats
    b2 = rig.request("b2", prompt(6, 800), BOB)
    b3 = rig.request("b3", prompt(6, 700), BOB)
    assert shares.owed([b2, b3]) == [b2]  # up to bob's share
