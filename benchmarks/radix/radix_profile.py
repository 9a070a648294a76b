"""`benchmarks/radix_ops.py --profile`: where match and insert spend their time (cProfile).

A separate pass over the same workload (profiling slows every call, so the timed figures come
from the unprofiled run); only the cache's match and insert calls are profiled.
"""

from __future__ import annotations

import cProfile
import io
import pstats
from collections.abc import Callable

from .radix_driver import ChatDriver
from .radix_phases import pages_per_user, tiny_cache
from .radix_workload import ChatWorkload

PROFILED = ("match", "insert")


def profile_calls(users: int, active: int, seed: int, top: int = 14) -> dict[str, str]:
    """The `top` functions by own time inside every match and every insert, as pstats text."""
    workload = ChatWorkload(seed, active)
    cache = tiny_cache((users + 1) * pages_per_user(workload.shape))
    driver = ChatDriver(cache)
    profiles = {name: cProfile.Profile() for name in PROFILED}

    def profiled(samples: list[int], call: Callable[..., object], *args: object) -> object:
        target = getattr(call, "func", call)  # a functools.partial names its function
        profile = profiles.get(getattr(target, "__name__", ""))
        if profile is None:
            return call(*args)
        profile.enable()
        try:
            return call(*args)
        finally:
            profile.disable()

    driver.timer = profiled
    for turn in workload.turns(max_users=users):
        driver.run(turn)
    texts = {}
    for name, profile in profiles.items():
        stream = io.StringIO()
        pstats.Stats(profile, stream=stream).sort_stats("tottime").print_stats(top)
        texts[name] = stream.getvalue()
    return texts
