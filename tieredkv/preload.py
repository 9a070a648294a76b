"""Start `tieredkv serve` with tcmalloc and Intel OpenMP preloaded when the machine has them.

Both matter on CPU (docs/architecture.md, "Where the code departs"): the engine runs the
model on its own thread, where GNU OpenMP slows every step and Intel OpenMP does not; glibc's
allocator hands large freed blocks back to the kernel, so every step's big activations fault
their pages in again, and tcmalloc keeps them. vLLM's CPU docs recommend the same pair. A
library can only be preloaded before the process starts, so `serve` re-executes itself once
with LD_PRELOAD set. TIEREDKV_NO_PRELOAD=1 opts out.

With Intel OpenMP it also sets KMP_BLOCKTIME=5 (unless already set), as vLLM's CPU worker
does: after a parallel region OpenMP's threads spin this many milliseconds before sleeping
(default 200). Spinning 200 ms after every step takes the cores from whatever runs next on
them: another replica's remote fetch, the copy threads of a promotion, Redis. A few
milliseconds keep the threads ready between the layers of one step without holding the
cores between steps; 0 would put them to sleep inside a step, and the forward slows down.

With tcmalloc it also sets TCMALLOC_RELEASE_RATE=0 (unless already set): tcmalloc otherwise
hands freed spans back to the kernel bit by bit, and the next request faults them in again
(microseconds a 4 KiB page in a VM): a short turn after a long prefill would pay hundreds of
page faults in its forward. The process then keeps the memory its largest step used.
"""

from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path

TCMALLOC_PATHS = (
    "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4",
    "/usr/lib/aarch64-linux-gnu/libtcmalloc_minimal.so.4",
    "/usr/lib64/libtcmalloc_minimal.so.4",
)
_DONE = "TIEREDKV_PRELOADED"  # set in the re-executed process: never loop
OPENMP_BLOCKTIME_MS = "5"
TCMALLOC_RELEASE_RATE = "0"  # never hand freed memory back: the next step would fault it in


def preload_libraries() -> list[str]:
    """The libraries to preload that exist here: tcmalloc (a system package) and Intel OpenMP
    (the `intel-openmp` wheel, installed under this interpreter's prefix)."""
    found = [next((path for path in TCMALLOC_PATHS if Path(path).exists()), None)]
    found.append(next((str(p) for p in Path(sys.prefix, "lib").glob("libiomp5.so")), None))
    return [path for path in found if path is not None]


def reexec_with_preload() -> None:
    """Replace this process with itself under LD_PRELOAD; returns when there is nothing to do."""
    if os.environ.get(_DONE) or os.environ.get("TIEREDKV_NO_PRELOAD"):
        return
    preload = os.environ.get("LD_PRELOAD", "")
    missing = [path for path in preload_libraries() if Path(path).name not in preload]
    if not missing:
        return
    env = dict(os.environ, LD_PRELOAD=" ".join([*missing, preload]).strip(), **{_DONE: "1"})
    if any(Path(path).name == "libiomp5.so" for path in missing):
        env.setdefault("KMP_BLOCKTIME", OPENMP_BLOCKTIME_MS)
    if any("tcmalloc" in Path(path).name for path in missing):
        env.setdefault("TCMALLOC_RELEASE_RATE", TCMALLOC_RELEASE_RATE)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, sys.orig_argv, env)


def release_free_memory() -> None:
    """Hand the allocator's free memory back to the kernel: tcmalloc's where it is preloaded
    (which otherwise keeps every freed page, see TCMALLOC_RELEASE_RATE), else glibc's
    (`malloc_trim`). For the end of start-up, whose loading frees more than a step uses."""
    process = ctypes.CDLL(None)
    release = getattr(process, "MallocExtension_ReleaseFreeMemory", None)
    if release is not None:
        release()
    elif (trim := getattr(process, "malloc_trim", None)) is not None:
        trim(0)
