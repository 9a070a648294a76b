"""tieredkv's tree against SGLang's RadixCache on one chat trace, replayed in the same process.

    benchmarks/sglang_radix.sh install        # once: SGLang 0.5.23 in .venv-sglang
    benchmarks/sglang_radix.sh run [--runs 5] [--json PATH]
    .venv/bin/python benchmarks/radix_vs_sglang.py --no-sglang   # tieredkv alone

The trace (its own seeded generator, nothing from tieredkv's workload code): 64 users x 8
rounds; a 300-token system prompt all users share, then per user a 2.2k-2.35k-token first
message; each later round appends the previous answer (40-80 tokens) and a new message (20-50):
prompts of 2.5k-3.4k tokens. Each round takes the users in a new shuffled order, one request at
a time; page size 16; 8,192 device pages (60% of the final working set), so most requests
evict (about 43% of prompt tokens hit: LRU keeps the histories of users who come back soon).

tieredkv is driven through the engine's own `RequestPages` (tieredkv/engine/request_pages.py),
with `Request` objects holding a `CacheHandle` and no model: arrival (match), admission (match,
promote: a done ticket on a device-only cache, lock), then prefill in 2,048-token chunks
(`grow`, then `insert_computed` after each chunk), decode one token per step (`grow` as pages
fill), and `release` at finish (insert prompt + output[:-1], free, unlock). The engine also
inserts a page as each fills during decode; SGLang does not, so this replay inserts only after
prefill chunks and at finish on both sides, and both trees see the same inserts. Timed:
`TieredCache.match` and `TieredCache.insert` (wrapped on the instance, which the handle calls),
and `Demoter.make_room` when the device is short (the eviction inside `allocate`).

SGLang (0.5.23, its `RadixCache` with LRU eviction over its `PagedTokenToKVPoolAllocator` on
CPU) is driven as its scheduler drives it: match twice (fill ids up to len - 1), lock, evict the
shortfall before each allocation (`evict_to_free_tokens`), insert after each prefill chunk and
at finish, free the duplicates the insert exposed, move the lock. Timed: `match_prefix`,
`insert`, `evict`. Keys and values (`RadixKey`, the index tensors) are built outside the timed
calls, as tieredkv's prompt is packed outside its timed calls.

Both replays alternate request by request (who goes first alternates too), so machine noise
hits both alike. Each run replays the whole trace on fresh caches after a warm-up of one round
of another trace; the headline is the median of the runs' p50 (p99) with min-max. A p99 is
shown only over 100+ samples. SGLang evicts whole leaves (often more than asked, so fewer
calls) where tieredkv evicts exactly the shortfall (splitting a leaf): the evict time per
evicted page is shown beside the per-call figures.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.abc
import importlib.machinery
import json
import random
import statistics
import sys
import time
import types
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from tieredkv.cache.page_layout import PageLayout
from tieredkv.cache.tier import Tier
from tieredkv.cache.tiered_cache import TieredCache
from tieredkv.cache.transfer.executor import ManualTransferExecutor
from tieredkv.config import CacheConfig, WritePolicy
from tieredkv.engine.protocol import GenerationRequest
from tieredkv.engine.request import Request
from tieredkv.engine.request_pages import RequestPages
from tieredkv.model.sampler import SamplingParams

PAGE_SIZE = 16
CHUNK_TOKENS = 2048  # EngineConfig.max_batch_tokens: prefill inserts at chunk ends
VOCAB = 49152
OPS = ("match", "insert", "evict")
# issue #11: SGLang 0.5.23 on this trace, p50 µs (shown only when SGLang cannot be imported)
REFERENCE_SGLANG_P50_US = {"match": 19.0, "insert": 30.0, "evict": 18.0}


@dataclass(frozen=True)
class Turn:
    user: int
    round: int
    prompt: list[int]
    output: list[int]


def make_trace(seed: int, users: int, rounds: int) -> list[Turn]:
    """The chat trace, in arrival order (see the module docstring)."""
    rng = random.Random(seed)

    def tokens(low: int, high: int) -> list[int]:
        return [rng.randrange(VOCAB) for _ in range(rng.randint(low, high))]

    system = tokens(300, 300)
    history = {user: system + tokens(2200, 2350) for user in range(users)}
    turns = []
    for round_index in range(rounds):
        order = list(range(users))
        rng.shuffle(order)
        for user in order:
            output = tokens(40, 80)
            turns.append(Turn(user, round_index, list(history[user]), output))
            history[user] += output + tokens(20, 50)
    return turns


Samples = dict[str, list[int]]  # op -> nanoseconds per call


def _timed(samples: list[int], call: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter_ns()
        result = call(*args, **kwargs)
        samples.append(time.perf_counter_ns() - start)
        return result

    return wrapper


class TieredkvReplay:
    """A device-only TieredCache of `num_pages` pages driven through `RequestPages`."""

    def __init__(self, num_pages: int) -> None:
        layout = PageLayout(1, 1, 1, PAGE_SIZE, torch.float32)  # the tree's cost, not the bytes
        config = CacheConfig(
            page_size=PAGE_SIZE,
            device_cache_bytes=num_pages * layout.page_bytes,
            host_cache_bytes=0,
            write_policy=WritePolicy.WRITE_BACK,
        )
        executor = ManualTransferExecutor()  # nothing moves between tiers: no threads
        self.cache = TieredCache(
            config, layout, b"radix-vs-sglang", memory_executor=executor, disk_executor=executor
        )
        self.pages = RequestPages(self.cache, PAGE_SIZE, reuse_prefixes=True)
        self.samples: Samples = {op: [] for op in OPS}
        self.hit_tokens = 0
        self.evicted_pages = 0
        cache = self.cache
        cache.match = _timed(self.samples["match"], cache.match)  # type: ignore[method-assign]
        cache.insert = _timed(self.samples["insert"], cache.insert)  # type: ignore[method-assign]
        make_room = _timed(self.samples["evict"], cache.demoter.make_room)
        plain_make_room = cache.demoter.make_room

        def evict_when_short(tier: Tier, count: int) -> bool:
            short = cache.pools.num_free(tier) < count
            if not short:
                return plain_make_room(tier, count)
            before = cache.pools.num_free(tier)
            done = make_room(tier, count)
            self.evicted_pages += cache.pools.num_free(tier) - before
            return done

        cache.demoter.make_room = evict_when_short  # type: ignore[method-assign]

    def run(self, turn: Turn, seq_id: int) -> None:
        spec = GenerationRequest(f"r{seq_id}", tuple(turn.prompt), SamplingParams())
        kv = self.cache.new_handle(spec.namespace)
        # RequestPages never reads the output processor or the generator: no model needed
        request = Request(spec, seq_id, output=None, generator=None, kv=kv)  # type: ignore[arg-type]
        pages = self.pages
        pages.on_arrival(request)
        assert pages.admit(request), "a device-only match promotes at once"
        pages.take_promotion(request)
        self.hit_tokens += request.kv_len
        prompt_len = len(turn.prompt)
        while request.kv_len < prompt_len:  # prefill, chunk by chunk
            end = min(request.kv_len + CHUNK_TOKENS, prompt_len)
            assert pages.grow(request, end), "device too small for one chunk"
            request.kv_len = end
            pages.insert_computed(request)
        request.output_ids.append(turn.output[0])  # sampled by the prefill's last step
        for token in turn.output[1:]:  # decode: one token per step
            assert pages.grow(request, request.kv_len + 1), "device too small to decode"
            request.kv_len += 1
            request.output_ids.append(token)
        pages.release(request, keep_computed=True)

    def check(self) -> None:
        result = self.cache.check_integrity()
        assert result.ok, result.problems[:5]


class SglangReplay:
    """SGLang's RadixCache over its paged allocator, `num_pages` pages, as its scheduler uses
    them (schedule_batch / mem_cache.common)."""

    def __init__(self, sg: types.SimpleNamespace, num_pages: int) -> None:
        self.sg = sg
        self.allocator = sg.PagedTokenToKVPoolAllocator(
            num_pages * PAGE_SIZE, PAGE_SIZE, torch.float32, "cpu", None, need_sort=False
        )
        params = sg.CacheInitParams(
            disable=False,
            req_to_token_pool=None,
            token_to_kv_pool_allocator=self.allocator,
            page_size=PAGE_SIZE,
        )
        self.tree = sg.RadixCache(params)
        self.samples: Samples = {op: [] for op in OPS}
        self.hit_tokens = 0
        self.evicted_pages = 0

    def _key(self, tokens: list[int]) -> Any:
        return self.sg.RadixKey(token_ids=array("q", tokens))

    def _match(self, tokens: list[int]) -> Any:
        params = self.sg.MatchPrefixParams(key=self._key(tokens[: len(tokens) - 1]))
        start = time.perf_counter_ns()
        result = self.tree.match_prefix(params)
        self.samples["match"].append(time.perf_counter_ns() - start)
        return result

    def _alloc(self, row: torch.Tensor, allocated: int, end: int) -> int:
        """Pages for tokens up to `end` into `row`, evicting the shortfall first."""
        need = -(-end // PAGE_SIZE) * PAGE_SIZE - allocated
        if need <= 0:
            return allocated
        available = self.allocator.available_size()
        if available < need:
            params = self.sg.EvictParams(num_tokens=need - available)
            start = time.perf_counter_ns()
            self.tree.evict(params)
            self.samples["evict"].append(time.perf_counter_ns() - start)
            self.evicted_pages += (self.allocator.available_size() - available) // PAGE_SIZE
        indices = self.allocator.alloc(need)
        assert indices is not None, "SGLang's pool too small for one chunk"
        row[allocated : allocated + need] = indices
        return allocated + need

    def _insert(self, tokens: list[int], row: torch.Tensor, protected: int, lock: Any) -> tuple:
        """Insert the full pages of `tokens` (`_insert_cache` + `checkpoint`); returns the new
        protected length and lock."""
        key_len = len(tokens) // PAGE_SIZE * PAGE_SIZE
        params = self.sg.InsertParams(key=self._key(tokens[:key_len]), value=row[:key_len].clone())
        start = time.perf_counter_ns()
        result = self.tree.insert(params)
        self.samples["insert"].append(time.perf_counter_ns() - start)
        self.allocator.free_segment(row[protected : result.prefix_len], start_pos=protected)
        node = result.last_device_node
        indices = self.tree.path_device_indices(node)
        row[protected : len(indices)] = indices[protected:]
        self.tree.inc_lock_ref(node)
        self.tree.dec_lock_ref(lock)
        return len(indices), node

    def run(self, turn: Turn, seq_id: int) -> None:
        del seq_id
        prompt = turn.prompt
        self._match(prompt)  # arrival: the queue's priority
        match = self._match(prompt)  # admission
        lock = match.last_device_node
        self.tree.inc_lock_ref(lock)
        prefix_len = match.device_prefix_len
        self.hit_tokens += prefix_len
        row = torch.empty(len(prompt) + len(turn.output) + PAGE_SIZE, dtype=torch.int64)
        row[:prefix_len] = self.tree.path_device_indices(lock)
        protected = allocated = kv_len = prefix_len
        while kv_len < len(prompt):
            end = min(kv_len + CHUNK_TOKENS, len(prompt))
            allocated = self._alloc(row, allocated, end)
            kv_len = end
            protected, lock = self._insert(prompt[:kv_len], row, protected, lock)
        for _ in turn.output[1:]:
            allocated = self._alloc(row, allocated, kv_len + 1)
            kv_len += 1
        tokens = prompt + turn.output[:-1]
        protected, lock = self._insert(tokens, row, protected, lock)
        if allocated > protected:
            self.allocator.free_segment(row[protected:allocated], start_pos=protected)
        self.tree.dec_lock_ref(lock)


def load_sglang() -> types.SimpleNamespace:
    """SGLang's radix cache and allocator. Its model configs import torchvision at module
    level; PyPI's torchvision is a CUDA build whose ops fail to register on CPU torch, so a
    stand-in module takes its place (the radix cache never calls it)."""
    if "torchvision" not in sys.modules:
        _install_torchvision_stand_in()
    names = {  # attribute -> module
        "sglang": "sglang",
        "PagedTokenToKVPoolAllocator": "sglang.srt.mem_cache.allocator",
        "EvictParams": "sglang.srt.mem_cache.base_prefix_cache",
        "InsertParams": "sglang.srt.mem_cache.base_prefix_cache",
        "MatchPrefixParams": "sglang.srt.mem_cache.base_prefix_cache",
        "CacheInitParams": "sglang.srt.mem_cache.cache_init_params",
        "RadixCache": "sglang.srt.mem_cache.radix_cache",
        "RadixKey": "sglang.srt.mem_cache.radix_cache",
    }
    found = {}
    for name, module_name in names.items():
        module = importlib.import_module(module_name)
        found[name] = module if name == module_name else getattr(module, name)
    return types.SimpleNamespace(**found)


class _Placeholder:
    """Any torchvision attribute: usable in annotations and defaults, an error when called."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __call__(self, *args: object, **kwargs: object) -> None:
        raise RuntimeError(f"{self._name}: torchvision is a stand-in here")

    def __getattr__(self, attr: str) -> _Placeholder:
        return _Placeholder(f"{self._name}.{attr}")


class _StandInFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Makes `torchvision` and each of its submodules a module of placeholders."""

    def find_spec(self, fullname: str, path: object, target: object = None) -> Any:
        if fullname == "torchvision" or fullname.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = types.ModuleType(spec.name)
        module.__path__ = []

        def attribute(attr: str) -> _Placeholder:
            if attr.startswith("__"):
                raise AttributeError(attr)
            return _Placeholder(f"{spec.name}.{attr}")

        module.__getattr__ = attribute  # type: ignore[method-assign]
        module.__version__ = "0.0"  # transformers parses it: too old for its vision paths
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def _install_torchvision_stand_in() -> None:
    sys.meta_path.insert(0, _StandInFinder())


def replay(trace: list[Turn], num_pages: int, sg: types.SimpleNamespace | None) -> dict[str, Any]:
    """Both trees through the whole trace, request by request."""
    systems: dict[str, Any] = {"tieredkv": TieredkvReplay(num_pages)}
    if sg is not None:
        systems["sglang"] = SglangReplay(sg, num_pages)
    names = list(systems)
    for seq_id, turn in enumerate(trace):
        for name in names if seq_id % 2 == 0 else reversed(names):
            systems[name].run(turn, seq_id)
    systems["tieredkv"].check()
    return systems


def percentiles(samples: list[int]) -> dict[str, float | None]:
    ordered = sorted(samples)
    if not ordered:
        return {"p50": None, "p99": None, "count": 0}
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] if len(ordered) >= 100 else None
    return {
        "p50": statistics.median(ordered) / 1000,
        "p99": p99 / 1000 if p99 is not None else None,
        "count": len(ordered),
    }


def summarise(systems: dict[str, Any], num_tokens: int) -> dict[str, Any]:
    return {
        name: {
            **{op: percentiles(system.samples[op]) for op in OPS},
            "hit_rate": system.hit_tokens / num_tokens,
            "evicted_pages": system.evicted_pages,
            "evict_us_per_page": sum(system.samples["evict"]) / 1000 / max(system.evicted_pages, 1),
        }
        for name, system in systems.items()
    }


def _spread(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"


def print_table(runs: list[dict[str, Any]], sglang_loaded: bool) -> None:
    print(f"\nmedian over {len(runs)} runs (min-max), µs per call")
    print(f"{'system':<10}{'op':<8}{'calls':>8}  {'p50':<22}{'p99':<22}")
    for name in runs[0]:
        for op in OPS:
            p50s = [r[name][op]["p50"] for r in runs if r[name][op]["p50"] is not None]
            p99s = [r[name][op]["p99"] for r in runs if r[name][op]["p99"] is not None]
            calls = runs[0][name][op]["count"]
            print(f"{name:<10}{op:<8}{calls:>8}  {_spread(p50s):<22}{_spread(p99s):<22}")
        hits = [r[name]["hit_rate"] * 100 for r in runs]
        evicted = runs[0][name]["evicted_pages"]
        per_page = _spread([r[name]["evict_us_per_page"] for r in runs])
        print(f"{name:<10}hit {_spread(hits)} % of prompt tokens; {evicted} pages evicted")
        print(f"{name:<10}evict time per evicted page {per_page} µs")
    if not sglang_loaded:
        ref = ", ".join(f"{op} {us:.0f}" for op, us in REFERENCE_SGLANG_P50_US.items())
        print(f"SGLang not run: reference p50 from issue #11 (another run): {ref} µs")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--device-pages", type=int, default=8192)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-sglang", action="store_true", help="time tieredkv alone")
    parser.add_argument("--json", help="write every run's figures here")
    args = parser.parse_args(argv)

    sg = None if args.no_sglang else load_sglang()
    import tieredkv

    print(f"tieredkv from {tieredkv.__path__[0]}, torch {torch.__version__}")
    if sg is not None:
        print(f"SGLang {sg.sglang.__version__} from {sg.sglang.__path__[0]}")
    trace = make_trace(args.seed, args.users, args.rounds)
    num_tokens = sum(len(turn.prompt) for turn in trace)
    lengths = [len(turn.prompt) for turn in trace]
    print(
        f"trace: {args.users} users x {args.rounds} rounds, prompts {min(lengths)}-"
        f"{max(lengths)} tokens, page {PAGE_SIZE}, {args.device_pages} device pages"
    )
    warm = make_trace(args.seed + 1, args.users, 1)
    replay(warm, args.device_pages, sg)
    runs = []
    for index in range(args.runs):
        systems = replay(trace, args.device_pages, sg)
        runs.append(summarise(systems, num_tokens))
        line = "  ".join(
            f"{name} " + " ".join(f"{op} {fig[op]['p50']:.1f}" for op in OPS if fig[op]["p50"])
            for name, fig in runs[-1].items()
        )
        print(f"run {index + 1}: p50 µs  {line}")
    print_table(runs, sg is not None)
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"args": vars(args), "runs": runs}, out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
