"""The order waiting requests are admitted in (`QueueOrder`).

FCFS is arrival order. Cache-aware (`lpm`): a waiting request's priority is the tokens its
prompt matches in the tree as it is now, each weighted by the tier that holds it (a device page
is worth more than a host page, which must still be copied, or a disk page, which must still be
read: pages ready sooner rank higher; a prefetch that lands moves a page up), plus
`aging_tokens_per_second` × its wait. A request that matched nothing overtakes any request
arriving after it once it has waited `max_model_len / aging_tokens_per_second` seconds (no match
is worth more than a whole context): under a steady stream of hot requests, a cold request's
extra wait is bounded by that time (2 s with the defaults: 8192 tokens / 4096 tokens/s) plus the
service of the requests already ahead of it.

The step's prefill budget goes to running requests in `prefill_order`: under `lpm` the fewest
prompt tokens left to compute first, aged by the same rate (a request's remaining tokens count
`aging_tokens_per_second` fewer for each second since its arrival), so a short prompt admitted
beside long ones gets its first token without waiting for theirs, and a long one is passed over
for at most its remaining tokens / `aging_tokens_per_second` seconds. `fcfs` keeps admission order.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from tieredkv.cache.tier import Tier
from tieredkv.config import SchedulePolicy
from tieredkv.engine.request import Request

TIER_WEIGHT = {Tier.DEVICE: 1.0, Tier.HOST: 0.75, Tier.DISK: 0.5, Tier.REMOTE: 0.4}
DEFAULT_AGING_TOKENS_PER_SECOND = 4096.0


@dataclass(frozen=True)
class QueueOrder:
    policy: SchedulePolicy
    aging_tokens_per_second: float = DEFAULT_AGING_TOKENS_PER_SECOND

    def priority(self, request: Request, now: float) -> tuple[float, float]:
        """Sort key: smaller runs first."""
        arrival = request.spec.arrival_time
        if self.policy is SchedulePolicy.FCFS:
            return (arrival, arrival)
        score = weighted_match_tokens(request)
        score += self.aging_tokens_per_second * max(0.0, now - arrival)
        return (-score, arrival)

    def ordered(self, waiting: Iterable[Request], now: float) -> list[Request]:
        return sorted(waiting, key=lambda request: self.priority(request, now))

    def prefill_order(self, prefilling: list[Request], now: float) -> list[Request]:
        """Running requests with prompt tokens left, in the order the step's budget serves
        them (`prefilling` is in admission order)."""
        if self.policy is SchedulePolicy.FCFS:
            return prefilling
        aging = self.aging_tokens_per_second
        return sorted(
            prefilling,
            key=lambda r: r.num_pending - aging * max(0.0, now - r.spec.arrival_time),
        )


def weighted_match_tokens(request: Request) -> float:
    """The tokens the request's last look-up matched, each weighted by its tier."""
    matched = request.kv.matched_tokens_by_tier
    return sum(TIER_WEIGHT[tier] * tokens for tier, tokens in matched.items() if tokens)
