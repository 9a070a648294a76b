"""The attention workspaces' share of the device budget, and which released slots give their
memory back to stay within it.

The workspaces (tieredkv.model.workspace) are a second copy of the running sequences' KV, so on
a CPU they are carved out of `--device-cache-size`: the device pool gets the rest. By default the
share is what the running sequences can need: their KV lies in the pool as well, so they hold at
most the pool's tokens, and at most `max_num_seqs` x `max_model_len`; half the budget (or that
product, if smaller) is therefore always enough. `--workspace-size` sets it: more keeps more
released slots resident for the next turn of a chat; less is a bound that running sequences may
pass while they run (released slots give their memory back first).

`SlotBudget` counts an arena's resident tokens per slot (written memory stays resident after a
sequence leaves, for the next one) and names the released slots to give back, those keeping no
chat's pages first, then the longest released.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable

from tieredkv.cache.page_layout import PageLayout
from tieredkv.config import CacheConfig, EngineConfig
from tieredkv.errors import ConfigError


def carve_workspace(
    cache: CacheConfig, engine: EngineConfig, layout: PageLayout, cpu_attention: bool
) -> tuple[CacheConfig, int]:
    """`cache` with the device pool's bytes (the budget less the workspaces'), and the
    workspaces' bytes (0 unless `cpu_attention`: other attention paths have none)."""
    if not cpu_attention:
        return cache, 0
    workspace_bytes = workspace_budget_bytes(
        cache.device_cache_bytes,
        layout.token_bytes,
        engine.max_num_seqs,
        engine.max_model_len,
        cache.workspace_bytes,
    )
    pool_bytes = cache.device_cache_bytes - workspace_bytes
    return dataclasses.replace(cache, device_cache_bytes=pool_bytes), workspace_bytes


def workspace_budget_bytes(
    device_bytes: int,
    token_bytes: int,
    max_seqs: int,
    max_len: int,
    configured: int | None = None,
) -> int:
    """Bytes of `device_bytes` the workspaces may hold (whole tokens): `configured`, else the
    default above, less whatever the pool needs to hold one `max_len` sequence."""
    sequence_bytes = max_len * token_bytes
    spare = device_bytes - sequence_bytes  # what the pool can give up
    if configured is not None:
        if configured > spare:
            raise ConfigError(
                f"--workspace-size {configured} B leaves the device pool "
                f"{device_bytes - configured} B of --device-cache-size {device_bytes} B, but "
                f"one --max-model-len {max_len} sequence needs {sequence_bytes} B"
            )
        return configured // token_bytes * token_bytes
    wanted = min(device_bytes // 2, max_seqs * sequence_bytes, max(spare, 0))
    return wanted // token_bytes * token_bytes


class SlotBudget:
    """Resident tokens of each slot of an arena (its high-water length, as written memory stays
    resident) against `budget_tokens`."""

    def __init__(self, slots: int, budget_tokens: int) -> None:
        self.budget_tokens = budget_tokens
        self.touched = [0] * slots
        self.resident_tokens = 0
        self._released_at = [0] * slots
        self._releases = 0

    def grow(self, slot: int, tokens: int) -> None:
        if tokens > self.touched[slot]:
            self.resident_tokens += tokens - self.touched[slot]
            self.touched[slot] = tokens

    def released(self, slot: int) -> None:
        self._releases += 1
        self._released_at[slot] = self._releases

    def over_budget(self) -> bool:
        return self.resident_tokens > self.budget_tokens

    def to_give_back(self, free: Iterable[int], kept: Collection[int]) -> list[int]:
        """The free slots whose memory goes back to bring the resident tokens within budget
        (as close as the free slots allow)."""
        excess = self.resident_tokens - self.budget_tokens
        written = [slot for slot in free if self.touched[slot]]
        written.sort(key=lambda slot: (slot in kept, self._released_at[slot]))
        chosen = []
        for slot in written:
            if excess <= 0:
                break
            chosen.append(slot)
            excess -= self.touched[slot]
        return chosen

    def given_back(self, slot: int) -> None:
        self.resident_tokens -= self.touched[slot]
        self.touched[slot] = 0
