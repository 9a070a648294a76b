"""Compile every Triton kernel for a CUDA target on a machine without a GPU.

Run as a script (not under the interpreter): `python compile_for_gpu.py ARCH`. The interpreter
checks the kernels' arithmetic, this checks what it cannot: that each kernel lowers to machine
code (dot shapes, loop and pointer types, constexpr branches), with the launch-time constexprs
of the default model (head_dim 64, 9 query heads over 3 kv heads, page_size 16).
"""

import os
import sys

assert os.environ.get("TRITON_INTERPRET", "0") in ("", "0"), "run without TRITON_INTERPRET"

import triton  # noqa: E402
from tieredkv.kernels import triton_decode, triton_pages, triton_prefill  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

INDEX_POINTERS = ("page_table_ptr", "query_start_ptr", "kv_lens_ptr", "page_ids_ptr")


def signature(kernel, dtype: str, constexprs: dict) -> dict:
    """The argument types of one launch: pointers by role, scalars as the launcher sees them."""
    types = {}
    for name in kernel.arg_names:
        if name in constexprs:
            types[name] = "constexpr"
        elif name in INDEX_POINTERS:
            types[name] = "*i32"
        elif name.startswith("part_"):
            types[name] = "*fp32"
        elif name.endswith("_ptr"):
            types[name] = f"*{dtype}"
        else:
            types[name] = "fp32" if name == "qk_scale" else "i32"
    return types


def main(arch: int) -> None:
    target = GPUTarget("cuda", arch, 32)
    launches = []
    for dtype, precision in (("bf16", None), ("fp32", "ieee")):
        common = dict(HEAD_DIM=64, PAGE_SIZE=16, GROUP=3, BLOCK_N=64, BLOCK_D=64,
                      DOT_FP32=False, PRECISION=precision)  # fmt: skip
        launches += [
            (triton_prefill._prefill_kernel, dtype, dict(common, BLOCK_M=64)),
            (triton_decode._decode_split_kernel, dtype, dict(common, BLOCK_H=16)),
            (triton_decode._decode_merge_kernel, dtype, dict(HEAD_DIM=64, BLOCK_S=2, BLOCK_D=64)),
        ]
    for to_staging in (True, False):
        constexprs = dict(RUN=3072, BLOCK=1024, TO_STAGING=to_staging)
        launches.append((triton_pages._copy_pages_kernel, "bf16", constexprs))
    for kernel, dtype, constexprs in launches:
        source = ASTSource(kernel, signature(kernel, dtype, constexprs), constexprs=constexprs)
        compiled = triton.compile(source, target=target)
        assert compiled.asm.get("cubin"), f"{kernel.__name__}: no cubin"
        print(f"{kernel.__name__} {dtype} sm_{arch}: ok")


if __name__ == "__main__":
    main(int(sys.argv[1]))
