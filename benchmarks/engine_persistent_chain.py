"""Does a persistent kernel remove the ~4.5 us each decode GEMM pays? (GPU experiment, one call, about a minute.)

At b <= 16 every GEMM of a decode step costs ~4.5 us + bytes / 4.47 TB/s on the H200
(``engine_gemv_configs.py``): 0.65 ms of a 4.8 ms step at b = 1. Weights do not depend on the previous GEMM's
output, so a kernel that stays resident across dependent GEMMs could stream the next weights while the last
programs of the current GEMM finish. This times a chain of S dependent GEMMs of the 8B o shape (x [1, 4096] through
S weights of 4096 x 4096, each GEMM's output the next one's input) three ways, each captured 10 times in a CUDA
graph (``gemm._time_us``):

* ``launches``: S launches of the engine's GEMM (``gemm.linear``: the chooser's pick, PDL on);
* ``persistent``: one launch of P programs (one an SM) that run every GEMM of the chain, one output tile of 32
  columns a program, separated by a grid barrier (a counter per GEMM: each program adds one after storing its tile,
  then spins until all P did; the last program out resets the counters);
* ``persistent+prefetch``: the same, and before each barrier a program hints its tile of the next weight into L2
  (``prefetch.global.L2``), so the next GEMM reads it from L2 while the others finish;
* ``persistent+chunks BNxCHUNK P=...`` (``_chunk_chain_kernel``): dependencies per K chunk instead of the barrier,
  each unit's weight block loaded one unit ahead of its wait, partials added by the tile's last unit; a sweep of
  tile shapes and programs per SM. Written after the first H200 run (session 7: 8 GEMMs took 89.0 us as
  launches, 100.2 us persistent, 100.3 us with the prefetch); checked in the interpreter (one program) and
  compiled for sm_90, not yet run on a GPU.

The first two kernels' inner loop is the engine's pointer GEMM loop (16-row dot, pipelined by Triton). Every
variant's output is checked against torch (the outputs are zeroed first). A wait that spins past MAX_SPIN is
counted in an error word and reported, and that variant is not timed (never a hang).

    python benchmarks/engine_persistent_chain.py --out $OUT/persistent_chain
    TRITON_INTERPRET=1 python benchmarks/engine_persistent_chain.py --device cpu   # dry run: one program
"""

from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl

from tabletune.engine import gemm
from tabletune.engine.gemm_kernels import _prefetch_l2
from tabletune.engine.profiling import write_diagnostic

MAX_SPIN = tl.constexpr(1 << 20)  # a barrier spinning longer (~1 s) counts as a timeout


@triton.jit
def _chain_kernel(w_ptr, y_ptr, bar_ptr, err_ptr, N, K, STAGES: tl.constexpr, P: tl.constexpr,
                  BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, K_LINES: tl.constexpr, PREFETCH: tl.constexpr,
                  SPIN: tl.constexpr):
    """y[s + 1] = y[s] W[s]^T for s < STAGES (W: [STAGES, N, K], N == K; y: [STAGES + 1, K], one row), tile t of
    32 columns on program t mod P, a grid barrier between GEMMs."""
    pid = tl.program_id(0)
    tiles = tl.cdiv(N, BLOCK_N)
    rows = tl.arange(0, 16)
    kk = tl.arange(0, BLOCK_K)
    for s in range(STAGES):
        w_s = w_ptr + s * N * K  # < 2^31 elements for the chains timed here
        for t in range(pid, tiles, P):
            cols = t * BLOCK_N + tl.arange(0, BLOCK_N)
            acc = tl.zeros([16, BLOCK_N], tl.float32)
            for k0 in range(0, K, BLOCK_K):
                k_ok = (k0 + kk) < K
                x = tl.load(y_ptr + s * K + rows[:, None] * 0 + (k0 + kk)[None, :],
                            mask=(rows[:, None] < 1) & k_ok[None, :], other=0.0, cache_modifier=".cg")
                w = tl.load(w_s + cols.to(tl.int64)[:, None] * K + (k0 + kk)[None, :],
                            mask=(cols[:, None] < N) & k_ok[None, :], other=0.0)
                acc += tl.dot(x, tl.trans(w))
            tl.store(y_ptr + (s + 1) * K + rows[:, None] * 0 + cols[None, :], acc.to(y_ptr.dtype.element_ty),
                     mask=(rows[:, None] < 1) & (cols[None, :] < N))
        if PREFETCH:
            if s + 1 < STAGES:  # this program's tiles of the next weight into L2 while the others finish this GEMM
                for t in range(pid, tiles, P):
                    cols = tl.minimum(t * BLOCK_N + tl.arange(0, BLOCK_N), N - 1).to(tl.int64)
                    pk = tl.minimum(tl.arange(0, K_LINES) * 64, K - 1)
                    _prefetch_l2(w_s + N * K + cols[:, None] * K + pk[None, :])
        tl.debug_barrier()  # every thread's store is issued before the release
        tl.atomic_add(bar_ptr + s, 1, sem="release")
        if SPIN:
            arrived = tl.atomic_add(bar_ptr + s, 0, sem="acquire")
            spins = 0
            while (arrived < P) & (spins < MAX_SPIN):
                arrived = tl.atomic_add(bar_ptr + s, 0, sem="acquire")
                spins += 1
            if spins >= MAX_SPIN:
                tl.atomic_add(err_ptr, 1)
        tl.debug_barrier()
    ticket = tl.atomic_add(bar_ptr + STAGES, 1, sem="acq_rel")
    if ticket == P - 1:  # every program has passed every barrier: reset for the next launch
        for s in range(STAGES + 1):
            tl.atomic_xchg(bar_ptr + s, 0)


def chain(w: torch.Tensor, y: torch.Tensor, bar: torch.Tensor, err: torch.Tensor, programs: int, prefetch: bool,
          block_n: int = 32, block_k: int = 256, stages: int = 4) -> torch.Tensor:
    s, n, k = w.shape
    _chain_kernel[(programs,)](w, y, bar, err, n, k, STAGES=s, P=programs, BLOCK_N=block_n, BLOCK_K=block_k,
                               K_LINES=triton.next_power_of_2(triton.cdiv(k, 64)), PREFETCH=prefetch,
                               SPIN=programs > 1, num_warps=4, num_stages=stages)
    return y


@triton.jit
def _chunk_chain_kernel(w_ptr, y_ptr, ws_ptr, cnt_ptr, rdy_ptr, err_ptr, H, STAGES: tl.constexpr, P: tl.constexpr,
                        BLOCK_N: tl.constexpr, CHUNK: tl.constexpr):
    """The same chain as ``_chain_kernel`` with dependencies per K chunk instead of a grid barrier. A work unit is
    (GEMM s, output tile t of BLOCK_N columns, K chunk c of CHUNK columns), U = tiles x chunks of them a GEMM,
    unit u of every GEMM on program u mod P, GEMMs in order on each program (so a unit only ever waits on units
    that every program runs earlier: no deadlock with all P programs resident). A unit's weight block is loaded
    one unit ahead, before its wait (weights never wait on activations); the unit waits until the CHUNK / BLOCK_N
    output tiles of GEMM s - 1 covering its chunk are done (``rdy``), multiplies, stores its fp32 partial, and the
    last of a tile's partials (a ticket, ``cnt``) adds them in chunk order, writes y[s + 1]'s tile and marks it in
    ``rdy``. The last program out resets the counters."""
    pid = tl.program_id(0)
    tiles = tl.cdiv(H, BLOCK_N)
    chunks = tl.cdiv(H, CHUNK)
    units = tiles * chunks
    per_prog = tl.cdiv(units, P)
    steps = STAGES * per_prog
    nn = tl.arange(0, BLOCK_N)
    kk = tl.arange(0, CHUNK)
    # the weight block of this program's first unit (GEMM 0, unit pid)
    r0 = tl.where(pid < units, (pid // chunks) * BLOCK_N, H) + nn  # weight rows (H and past: none)
    k0 = (pid % chunks) * CHUNK + kk
    w_next = tl.load(w_ptr + r0.to(tl.int64)[:, None] * H + k0[None, :], mask=(r0[:, None] < H) & (k0[None, :] < H),
                     other=0.0)
    for j in range(steps):
        w_cur = w_next
        s = j // per_prog
        u = pid + (j % per_prog) * P
        jn = j + 1  # the next unit's weight block, issued before this unit waits
        sn = jn // per_prog
        un = pid + (jn % per_prog) * P
        rn = tl.where((jn < steps) & (un < units), (un // chunks) * BLOCK_N, H) + nn
        kn = (un % chunks) * CHUNK + kk
        w_next = tl.load(w_ptr + sn * H * H + rn.to(tl.int64)[:, None] * H + kn[None, :],
                         mask=(rn[:, None] < H) & (kn[None, :] < H), other=0.0)
        if u < units:
            t, c = u // chunks, u % chunks
            if s > 0:  # wait for the producer tiles of x's chunk c
                need = tl.cdiv(tl.minimum(CHUNK, H - c * CHUNK), BLOCK_N)  # the tiles covering chunk c
                arrived = tl.atomic_add(rdy_ptr + s * chunks + c, 0, sem="acquire")
                spins = 0
                while (arrived < need) & (spins < MAX_SPIN):
                    arrived = tl.atomic_add(rdy_ptr + s * chunks + c, 0, sem="acquire")
                    spins += 1
                if spins >= MAX_SPIN:
                    tl.atomic_add(err_ptr, 1)
                tl.debug_barrier()
            k_idx = c * CHUNK + kk
            x = tl.load(y_ptr + s * H + k_idx, mask=k_idx < H, other=0.0, cache_modifier=".cg").to(tl.float32)
            part = tl.sum(w_cur.to(tl.float32) * x[None, :], 1)
            cols = t * BLOCK_N + nn
            tl.store(ws_ptr + (s * chunks + c) * H + cols, part, mask=cols < H)
            tl.debug_barrier()  # every thread's partial is stored before the ticket
            ticket = tl.atomic_add(cnt_ptr + s * tiles + t, 1, sem="acq_rel")
            if ticket == chunks - 1:  # the tile's last partial: add them in chunk order, publish the tile
                total = tl.zeros([BLOCK_N], tl.float32)
                for cc in range(chunks):
                    total += tl.load(ws_ptr + (s * chunks + cc) * H + cols, mask=cols < H, other=0.0,
                                     cache_modifier=".cg")
                tl.store(y_ptr + (s + 1) * H + cols, total.to(y_ptr.dtype.element_ty), mask=cols < H)
                tl.atomic_xchg(cnt_ptr + s * tiles + t, 0)
                tl.debug_barrier()
                tl.atomic_add(rdy_ptr + (s + 1) * chunks + (t * BLOCK_N) // CHUNK, 1, sem="release")
    ticket = tl.atomic_add(rdy_ptr + (STAGES + 1) * chunks, 1, sem="acq_rel")
    if ticket == P - 1:  # every unit is done: reset the ready counters for the next launch
        for i in range((STAGES + 1) * chunks + 1):
            tl.atomic_xchg(rdy_ptr + i, 0)


def chunk_chain(w: torch.Tensor, y: torch.Tensor, err: torch.Tensor, programs: int, block_n: int = 64,
                chunk: int = 256, warps: int = 8) -> torch.Tensor:
    """``_chunk_chain_kernel`` over the chain (its workspace and counters are made on first use, per shape)."""
    s, h, _ = w.shape
    if chunk % block_n:
        raise ValueError(f"chunk_chain: chunk {chunk} is not a multiple of block_n {block_n}")
    key = (s, h, chunk, w.device)
    if key not in _chunk_state:
        chunks, tiles = triton.cdiv(h, chunk), triton.cdiv(h, block_n)
        _chunk_state[key] = (torch.empty(s * chunks * h, dtype=torch.float32, device=w.device),
                             torch.zeros(s * tiles, dtype=torch.int32, device=w.device),
                             torch.zeros((s + 1) * chunks + 1, dtype=torch.int32, device=w.device))
    ws, cnt, rdy = _chunk_state[key]
    _chunk_chain_kernel[(programs,)](w, y, ws, cnt, rdy, err, h, STAGES=s, P=programs, BLOCK_N=block_n, CHUNK=chunk,
                                     num_warps=warps)
    return y


_chunk_state: dict[tuple, tuple[torch.Tensor, ...]] = {}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stages", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--chunk-configs", default="64x256,32x512,128x128",
                    help="persistent+chunks variants: BLOCK_N x CHUNK, comma-separated")
    ap.add_argument("--programs-per-sm", default="1,2", help="persistent+chunks variants: programs per SM")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", default="persistent_chain")
    args = ap.parse_args(argv)
    dev = args.device
    cuda = dev == "cuda"
    h, s = (args.hidden, args.stages) if cuda else (128, 3)
    dt = torch.bfloat16 if cuda else torch.float32
    w = torch.randn(s, h, h, dtype=dt, device=dev) / h ** 0.5
    bar = torch.zeros(s + 1, dtype=torch.int32, device=dev)
    err = torch.zeros(1, dtype=torch.int32, device=dev)
    y = torch.zeros(s + 1, h, dtype=dt, device=dev)
    y[0] = torch.randn(h, dtype=dt, device=dev)
    ref = [y[0].float()]
    for i in range(s):
        ref.append((ref[-1].to(dt).float() @ w[i].float().t()))
    programs = torch.cuda.get_device_properties(dev).multi_processor_count if cuda else 1
    lines, rows = [], []

    def launches():
        x = y[:1]
        for i in range(s):
            x = gemm.linear(x, w[i])
        return x
    variants = {"launches": launches,
                "persistent": lambda: chain(w, y, bar, err, programs, False),
                "persistent+prefetch": lambda: chain(w, y, bar, err, programs, True)}
    if not cuda:  # the interpreter has no inline PTX (the L2 prefetch) and runs one program at a time
        del variants["persistent+prefetch"]
    for cfg in args.chunk_configs.split(",") if cuda else ("32x64",):
        bn, chunk = (int(v) for v in cfg.split("x"))
        for per_sm in (int(v) for v in args.programs_per_sm.split(",")) if cuda else (1,):
            variants[f"persistent+chunks {bn}x{chunk} P={programs * per_sm}"] = \
                lambda bn=bn, chunk=chunk, p=programs * per_sm: chunk_chain(w, y, err, p, bn, chunk)
    for name, fn in variants.items():
        before = int(err.item())
        y[1:].zero_()  # a kernel that wrote nothing must not pass on the previous variant's outputs
        out = fn().float()
        got = out[-1] if out.shape[0] == s + 1 else out[0]
        rel = float((got - ref[-1]).norm() / ref[-1].norm())
        # a barrier that timed out (programs not all resident) is reported, not timed: each wait costs ~1 s
        us = gemm._time_us(fn) if cuda and int(err.item()) == before else float("nan")
        mb = s * h * h * y.element_size() / 1e6
        lines.append(f"{name:34s} {s} GEMMs of {h}x{h} (M = 1, {mb:.0f} MB): {us:8.2f} us "
                     f"({mb / us if us == us else float('nan'):.2f} TB/s); relative error {rel:.1e}; barrier timeouts "
                     f"{int(err.item()) - before}")
        print(lines[-1], flush=True)
        rows.append({"variant": name, "us": round(us, 2), "rel_err": rel, "barrier_timeouts": int(err.item()) - before})
    write_diagnostic(args.out, lines, stages=s, hidden=h, programs=programs, rows=rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
