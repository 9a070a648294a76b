"""Conversations kept warm: for `think_time_s` after a turn, the pages of the conversation it
named (`GenerationRequest.session`: the `user` field or the X-Session-ID header) stay on host,
as a pinned prefix's do (`tieredkv.cache.pins`: device copies may leave, to host; host and disk
copies do not), so the next turn finds its history in memory rather than on disk. A session
holds its latest turn's pages only (the next turn's path contains the previous one's); its
hold ends when the think time is over or a next turn replaces it. Engine thread only.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field

from tieredkv.cache.cache_handle import WarmHold
from tieredkv.cache.tier import Tier
from tieredkv.cache.tiered_cache import TieredCache

DEFAULT_THINK_TIME_S = 60.0


@dataclass
class _Hold:
    pages: WarmHold
    until: float


@dataclass
class SessionWarmth:
    cache: TieredCache
    think_time_s: float = DEFAULT_THINK_TIME_S
    _holds: dict[str, _Hold] = field(default_factory=dict)
    _expiries: list[tuple[float, int, str, _Hold]] = field(default_factory=list)
    _seq: itertools.count = field(default_factory=itertools.count)

    @property
    def enabled(self) -> bool:
        return self.think_time_s > 0 and self.cache.tier_enabled(Tier.HOST)

    def keep(self, session: str, pages: WarmHold, now: float) -> None:
        """A turn of `session` ended: its pages stay on host for the think time."""
        previous = self._holds.pop(session, None)
        if previous is not None:
            previous.pages.release()
        hold = _Hold(pages, now + self.think_time_s)
        self._holds[session] = hold
        heapq.heappush(self._expiries, (hold.until, next(self._seq), session, hold))

    def expire(self, now: float) -> None:
        """Release the holds whose think time is over (once a step)."""
        while self._expiries and self._expiries[0][0] <= now:
            _, _, session, hold = heapq.heappop(self._expiries)
            if self._holds.get(session) is hold:
                del self._holds[session]
            hold.pages.release()

    def __len__(self) -> int:
        return len(self._holds)
