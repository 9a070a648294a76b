"""SGLang's side of benchmarks/radix_vs_sglang.py: its `RadixCache` (LRU eviction) over its
`PagedTokenToKVPoolAllocator` on CPU, driven as its scheduler drives them (schedule_batch,
mem_cache.common).

Per turn: match twice (arrival and admission; fill ids up to len - 1), lock, evict the
shortfall before each allocation (`evict_to_free_tokens`), insert after each prefill chunk and
at finish, free the duplicates the insert exposed, move the lock. Timed: `match_prefix`,
`insert`, `evict`. Keys and values (`RadixKey`, the index tensors) are built outside the timed
calls, as tieredkv's prompt is packed outside its timed calls.

SGLang runs in its own venv (benchmarks/sglang_radix.sh install); `load_sglang` raises
`SglangMissingError`, saying so, where it cannot be imported.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import time
import types
from array import array
from typing import Any

import torch

from .replay_trace import CHUNK_TOKENS, OPS, PAGE_SIZE, Samples, Turn

SGLANG_NAMES = {  # attribute -> module
    "sglang": "sglang",
    "PagedTokenToKVPoolAllocator": "sglang.srt.mem_cache.allocator",
    "EvictParams": "sglang.srt.mem_cache.base_prefix_cache",
    "InsertParams": "sglang.srt.mem_cache.base_prefix_cache",
    "MatchPrefixParams": "sglang.srt.mem_cache.base_prefix_cache",
    "CacheInitParams": "sglang.srt.mem_cache.cache_init_params",
    "RadixCache": "sglang.srt.mem_cache.radix_cache",
    "RadixKey": "sglang.srt.mem_cache.radix_cache",
}


_HOW = (
    "run `benchmarks/sglang_radix.sh install`, then `benchmarks/sglang_radix.sh run`, "
    "or pass --no-sglang to time tieredkv alone"
)


class SglangMissingError(RuntimeError):
    """SGLang's radix cache cannot be imported in this interpreter."""


class SglangReplay:
    """SGLang's RadixCache over its paged allocator, `num_pages` pages."""

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
        assert indices is not None, f"SGLang's pool has no {need} free tokens for one chunk"
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
    if importlib.util.find_spec("sglang") is None:
        raise SglangMissingError(f"sglang is not installed here ({sys.executable}): {_HOW}")
    if "torchvision" not in sys.modules:
        sys.meta_path.insert(0, _StandInFinder())
    found = {}
    for name, module_name in SGLANG_NAMES.items():
        try:
            module = importlib.import_module(module_name)
        except ImportError as error:
            raise SglangMissingError(f"cannot import {module_name} ({error}): {_HOW}") from error
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
