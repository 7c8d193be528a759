"""Compile the split-K GEMM kernel's variants for sm_90 without a GPU and print what each one became.

For each config and each variant (plain, NORM, NORM + SILU, RESID epilogues, GATED, GATED + RESID) of
``gemm_kernels._gemm_kernel``: shared memory, registers and spill bytes (Triton's bundled ptxas) and the mix of
global loads in the PTX (``cp.async``: software-pipelined through shared memory; ``ld.global``: straight to
registers). The pointer and size arguments get the JIT's 16-divisibility hints, as a launch on aligned tensors
does, and M = 1 is a constant, as the JIT specialises it. Runs on the CPU with whichever Triton is installed
(``PYTHONPATH=<a folder with another triton> python ...`` to compare versions).

    python benchmarks/engine_offline_compile.py --configs 16,64,256,2,4,4 16,32,128,2,4,6
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from tabletune.engine.gemm_kernels import _gemm_kernel

TYPES = {"x_ptr": "*bf16", "w_ptr": "*bf16", "y_ptr": "*bf16", "ws_ptr": "*fp32", "cnt_ptr": "*i32",
         "ss_in_ptr": "*fp32", "ss_out_ptr": "*fp32", "M": "i32", "N": "i32", "K": "i32",
         "K_PER_SPLIT": "i32", "WS_STRIDE": "i32", "NT_IN": "i32", "eps": "fp32"}
DIVISIBLE = ("x_ptr", "w_ptr", "y_ptr", "ws_ptr", "cnt_ptr", "ss_in_ptr", "ss_out_ptr", "N", "K",
             "K_PER_SPLIT", "WS_STRIDE")
VARIANTS = {"plain": (False, False, False, False), "norm": (True, False, False, False),
            "norm+silu": (True, False, False, True), "resid": (False, True, False, False),
            "gated": (False, False, True, False), "gated+resid": (False, True, True, False)}


def compile_variant(cfg: tuple[int, ...], norm: bool, resid: bool, gated: bool, silu: bool, folder: str) -> dict:
    bm, bn, bk, split, warps, stages = cfg
    names = _gemm_kernel.arg_names
    const = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, SPLIT=split, GATED=gated, USE_PDL=True, PREFETCH_K=256,
                 NORM=norm, RESID=resid, SILU=silu, NT_P=64, M=1)
    signature = {n: "constexpr" if n in const else TYPES[n] for n in names}
    src = ASTSource(_gemm_kernel, signature, constexprs={(names.index(k),): v for k, v in const.items()},
                    attrs={(names.index(n),): [["tt.divisibility", 16]] for n in DIVISIBLE})
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 64), options=dict(num_warps=warps, num_stages=stages))
    ptx = kernel.asm["ptx"]
    path = os.path.join(folder, "k.ptx")
    with open(path, "w") as f:
        f.write(ptx)
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    log = subprocess.run([ptxas, "-arch=sm_90a", "-v", path, "-o", os.path.join(folder, "k.cubin")],
                         capture_output=True, text=True).stderr
    regs = re.findall(r"Used (\d+) registers", log)
    spills = re.findall(r"(\d+) bytes spill stores", log)
    loads = collections.Counter(re.findall(r"\b(cp\.async\.(?:cg|ca)|ld\.global[\w.]*)", ptx))
    return {"shared_bytes": kernel.metadata.shared, "registers": int(regs[0]) if regs else None,
            "spill_bytes": int(spills[0]) if spills else None, "loads": dict(loads)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", nargs="+", default=["16,64,256,2,4,4", "16,64,256,1,4,4", "16,32,128,2,4,6"],
                    help="bm,bn,bk,split,warps,stages of the pointer kernel")
    args = ap.parse_args(argv)
    print(f"triton {triton.__version__}")
    with tempfile.TemporaryDirectory() as folder:
        for text in args.configs:
            cfg = tuple(int(v) for v in text.split(","))
            for name, flags in VARIANTS.items():
                try:
                    r = compile_variant(cfg, *flags, folder)
                except Exception as exc:  # a variant that does not compile: say so and go on
                    print(f"{cfg} {name:12s} FAILED {type(exc).__name__}: {str(exc)[:200]}")
                    continue
                print(f"{cfg} {name:12s} shared {r['shared_bytes']:6d} B, {r['registers']} registers, "
                      f"{r['spill_bytes']} B spilled, loads {r['loads']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
