"""Fair owners in the batch: whose sequences get a step's seats, whose waiting request joins a
full batch, and whose sequence gives up its device pages first.

An owner is what one budget covers (`tieredkv.tenants.namespace_owner`): a tenant with all its
namespaces, else the namespace itself. A request with `n` (or `best_of`) sequences forks them
all at its first token, and the forks run at once, past `--max-num-seqs` when they can share
the prompt's pages. By arrival order alone, one owner's large `n` then holds every seat of
every step and most of the device; another owner's request waits until most of those sequences
have finished, and once admitted it is the youngest, so the first preempted. Instead:

- Each owner with work (a sequence running, promoting or waiting) has an equal share of the
  `max_num_seqs` seats (at least one).
- Decodes take the step's seats round-robin over the owners (each owner's sequences oldest
  first), so every owner running is forwarded before any owner gets a second seat.
- Waiting requests of owners below their share are admitted first, keeping their queue order,
  and seats are held back from the decodes for them. While an owner is above its share such a
  request joins a full batch; when its prompt does not fit on the device, sequences of the
  owner furthest above its share are preempted for it.
- A sequence that needs a device page preempts the youngest sequence of the owner holding the
  most, not the youngest overall.

With one owner (no keys and no salts) every rule reduces to plain order: one share of all
seats, decodes oldest first, the youngest preempted.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from itertools import zip_longest

from tieredkv.engine.request import Request
from tieredkv.tenants import namespace_owner


def owner(request: Request) -> str:
    return namespace_owner(request.spec.namespace)


def round_robin(requests: Iterable[Request]) -> list[Request]:
    """Each owner's first request, then each one's second, and so on; owners in the order of
    their first request, each owner's requests in the given order."""
    by_owner: dict[str, list[Request]] = {}
    for request in requests:
        by_owner.setdefault(owner(request), []).append(request)
    rounds = zip_longest(*by_owner.values())
    return [request for round_ in rounds for request in round_ if request is not None]


class SeatShares:
    """The sequences each owner holds (running or promoting) and its share of the seats, as
    of one step's start; `take` counts an admission in."""

    def __init__(
        self,
        held: Iterable[Request],
        waiting: Iterable[Request],
        max_num_seqs: int,
    ) -> None:
        self.held = Counter(owner(request) for request in held)
        owners = set(self.held) | {owner(request) for request in waiting}
        self.share = max(1, max_num_seqs // max(1, len(owners)))

    def below_share(self, request: Request) -> bool:
        return self.held[owner(request)] < self.share

    def anyone_above_share(self) -> bool:
        return any(count > self.share for count in self.held.values())

    def owed(self, waiting: Iterable[Request]) -> list[Request]:
        """Waiting requests (in the given order) owed a seat: while an owner is above its
        share, those of each owner below it, up to its share. They join the batch before any
        further request of the owners above."""
        if not self.anyone_above_share():
            return []
        owed: list[Request] = []
        counted = Counter[str]()
        for request in waiting:
            name = owner(request)
            if self.held[name] + counted[name] < self.share:
                counted[name] += 1
                owed.append(request)
        return owed

    def above_share(self, requests: Iterable[Request]) -> list[Request]:
        """Those of `requests` whose owner holds more than its share."""
        return [request for request in requests if self.held[owner(request)] > self.share]

    def take(self, request: Request) -> None:
        self.held[owner(request)] += 1

    def release(self, request: Request) -> None:
        self.held[owner(request)] -= 1


def preemption_victim(running: Sequence[Request], spared: Iterable[Request]) -> Request | None:
    """The youngest of `running` (admission order) not `spared`, from the owner holding the
    most running sequences among those that have one to give; None: nobody to give."""
    spared_ids = {id(request) for request in spared}
    candidates = [request for request in running if id(request) not in spared_ids]
    if not candidates:
        return None
    held = Counter(owner(request) for request in running)
    most = max(held[owner(request)] for request in candidates)
    return next(request for request in reversed(candidates) if held[owner(request)] == most)
