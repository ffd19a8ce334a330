"""Experiment (not a kernel path): small_mma's arithmetic in Gluon, the weight codes loaded from
global memory straight into the MMA's B-operand registers (mma_v2, m16n8k32 int8), no shared
memory staging. Kept so the comparison can be rerun; results/h200/s8 has the numbers.

Same arithmetic and FP32 order as kernels.small_mma (planes by one shift and AND per code word,
the int32 accumulator seeded with -t, acc + dot*xs*ws over ascending groups, split partials
summed in split order by the tile's last program), so the outputs must equal small_mma's bit
for bit; on the H200 they did in 12 of 12 shape and M cases. It was slower, 0.49-0.98x: with
one group of lookahead in registers (DB) or none, a warp has far fewer bytes in flight than
small_mma's three-stage cp.async pipeline. The loop without lookahead compiles to 240
instructions a thread (small_mma: 236); the register lookahead adds byte repacking (PRMT) of
the loop-carried int8 tile, 323 in all.

    python tools/gluon_small_mma.py compile [--n N --k K --m M] [--db]     # no GPU: the sm_90 loop
    python tools/gluon_small_mma.py time [--m 2,16] [--shapes gate_up,...] [--json F]   # on a GPU

Gluon does not run under TRITON_INTERPRET=1; the compile needs it unset.
"""
import argparse
import json
import os
import sys
import time

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2

sys.path.insert(0, os.path.dirname(__file__))
import sm90  # noqa: E402  (tools/ is not a package)
from decode_sweep import pq2_shape_names  # noqa: E402

from pq2verify.cli import positive_ints  # noqa: E402


@gluon.jit
def _plane(c, s: gl.constexpr):
    # common.code_plane's CUDA form in Gluon (a triton.jit helper cannot be called from here)
    if s == 0:
        return gl.inline_asm_elementwise("and.b32 $0, $1, 0x03030303;", "=r,r", [c], dtype=gl.int8,
                                         is_pure=True, pack=4)
    elif s == 1:
        return gl.inline_asm_elementwise("{.reg .b32 t; shr.b32 t, $1, 2; and.b32 $0, t, 0x03030303;}", "=r,r", [c],
                                         dtype=gl.int8, is_pure=True, pack=4)
    elif s == 2:
        return gl.inline_asm_elementwise("{.reg .b32 t; shr.b32 t, $1, 4; and.b32 $0, t, 0x03030303;}", "=r,r", [c],
                                         dtype=gl.int8, is_pure=True, pack=4)
    else:
        return gl.inline_asm_elementwise("{.reg .b32 t; shr.b32 t, $1, 6; and.b32 $0, t, 0x03030303;}", "=r,r", [c],
                                         dtype=gl.int8, is_pure=True, pack=4)


@gluon.jit
def _kernel(q_ptr, q_sm, xs_ptr, xs_sm, t_ptr, t_sm, codes_ptr, scales_ptr, out_ptr, out_sm, out_sn,
            part_ptr, count_ptr, M, N, G, scale_off,
            BN: gl.constexpr, PER: gl.constexpr, SPLIT: gl.constexpr, NW: gl.constexpr, PDL: gl.constexpr,
            DB: gl.constexpr):
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, NW], instr_shape=[16, 8])
    la: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=4)
    lb: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=4)
    if PDL:
        gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // dummy $0", "=r", [], dtype=gl.int32,
                                  is_pure=False, pack=1)
    pid_n = gl.program_id(0)
    pid_k = gl.program_id(1)
    # activations [16, 32] per plane (A operand); code bytes [32, BN] (B operand), both straight from global
    am = gl.arange(0, 16, layout=gl.SliceLayout(1, la))
    ak = gl.arange(0, 32, layout=gl.SliceLayout(0, la))
    a_off = gl.expand_dims(am, 1) * q_sm + gl.expand_dims(ak, 0)
    a_ok = gl.expand_dims(am < M, 1) & gl.expand_dims(ak < 32, 0)
    bk = gl.arange(0, 32, layout=gl.SliceLayout(1, lb))
    bn = pid_n * BN + gl.arange(0, BN, layout=gl.SliceLayout(0, lb))
    b_off = gl.expand_dims(bk, 1) + gl.expand_dims(bn, 0) * (G * 32)
    om = gl.arange(0, 16, layout=gl.SliceLayout(1, mma))
    on = pid_n * BN + gl.arange(0, BN, layout=gl.SliceLayout(0, mma))
    m_ok = om < M
    g0 = pid_k * PER
    c = gl.load(codes_ptr + b_off + g0 * 32)      # constants: before the PDL wait
    if PDL:
        gl.inline_asm_elementwise("griddepcontrol.wait; // dummy $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)
    acc = gl.zeros([16, BN], gl.float32, layout=mma)
    for i in range(PER):
        g = g0 + i
        if DB:
            c_next = gl.load(codes_ptr + b_off + (g0 + (i + 1) % PER) * 32)
        else:
            c = gl.load(codes_ptr + b_off + g * 32)
        t = gl.load(t_ptr + om * t_sm + g, mask=m_ok, other=0)
        xs = gl.load(xs_ptr + om * xs_sm + g, mask=m_ok, other=0.0)
        ws = gl.load(scales_ptr + scale_off + on * G + g).to(gl.float32)
        d = gl.zeros([16, BN], gl.int32, layout=mma) - gl.expand_dims(t, 1)
        for s in gl.static_range(4):
            a = gl.load(q_ptr + a_off + (g * 128 + s * 32), mask=a_ok, other=0)
            d = mma_v2(a, _plane(c, s), d)
        acc = acc + d.to(gl.float32) * gl.expand_dims(xs, 1) * gl.expand_dims(ws, 0)
        if DB:
            c = c_next
    ok = gl.expand_dims(m_ok, 1) & gl.expand_dims(on < N, 0)
    out_offs = gl.expand_dims(om, 1) * out_sm + gl.expand_dims(on, 0) * out_sn
    if SPLIT == 1:
        gl.store(out_ptr + out_offs, acc.to(out_ptr.dtype.element_ty), mask=ok)
    else:
        # splitk.sum_if_last in Gluon: the tile's last program sums the partials in split order
        p_offs = gl.expand_dims(om, 1) * N + gl.expand_dims(on, 0)
        gl.store(part_ptr + pid_k * M * N + p_offs, acc, mask=ok)
        gl.thread_barrier()
        arrived = gl.atomic_add(count_ptr + pid_n, 1, sem="acq_rel", scope="gpu")
        if arrived == SPLIT - 1:
            gl.thread_barrier()
            y = gl.load(part_ptr + p_offs, mask=ok, other=0.0, cache_modifier=".cg")
            for s in gl.static_range(1, SPLIT):
                y = y + gl.load(part_ptr + s * M * N + p_offs, mask=ok, other=0.0, cache_modifier=".cg")
            gl.store(out_ptr + out_offs, y.to(out_ptr.dtype.element_ty), mask=ok)
            gl.store(count_ptr + pid_n, 0)


def supported(n: int, k: int, cfg: dict) -> bool:
    """The prototype has no masked tiles: N a multiple of BN, every split full."""
    return n % cfg["BN"] == 0 and (k // 128) % cfg["groups_per_split"] == 0


def run(x, w, out, cfg, *, db=False):
    """small_mma.run with this kernel (prepared weights; small_mma's config `cfg`)."""
    from kernels import prepare, splitk
    m, k = x.shape
    n = w.n
    if w.layout != "prepared" or not supported(n, k, cfg):
        raise ValueError(f"gluon_small_mma: {n}x{k} {w.layout} with {cfg}: prepared weights, N % BN == 0 "
                         "and full splits only")
    bn, per, split = cfg["BN"], cfg["groups_per_split"], cfg["SPLIT"]
    count = torch.empty(n // bn, dtype=torch.int32, device=x.device) if split > 1 else None
    q, xs, t = prepare.quantize_q8(x, order="plane", pdl=True, zero=count)
    part = splitk.partials(x.device, split * m * n) if split > 1 else out
    _kernel[(n // bn, split)](
        q, q.stride(0), xs, xs.stride(0), t, t.stride(0), w.codes_u8, w.scales_f16, out, out.stride(0),
        out.stride(1), part, count if split > 1 else t, m, n, w.groups, w.strides["scale_off"],
        BN=bn, PER=per, SPLIT=split, NW=cfg["num_warps"], PDL=True, DB=db, num_warps=cfg["num_warps"],
        launch_pdl=True)
    return out


def compile_args(n: int, k: int, m: int, db: bool):
    """(small_mma's config, sm90.compile_sm90 arguments) of this kernel for prepared N x K, M rows."""
    from kernels import small_mma
    cfg = small_mma.config(n, k, m, interpret=False)
    g = k // 128
    ptrs = dict(q_ptr="*i8", xs_ptr="*fp32", t_ptr="*i32", codes_ptr="*u8", scales_ptr="*fp16", out_ptr="*bf16",
                part_ptr="*fp32", count_ptr="*i32")
    ints = dict(q_sm=k, xs_sm=g, t_sm=g, out_sm=n, out_sn=1, M=m, N=n, G=g, scale_off=n * k // 8)
    consts = dict(BN=cfg["BN"], PER=cfg["groups_per_split"], SPLIT=cfg["SPLIT"], NW=cfg["num_warps"], PDL=True, DB=db)
    return cfg, (_kernel, ptrs, ints, consts, cfg["num_warps"], 1)


def loop_counts(n: int, k: int, m: int, db: bool) -> dict:
    """The sm_90 loop of this kernel, compiled on the CPU: {opcode: count} of its longest loop."""
    _, args = compile_args(n, k, m, db)
    kern, _ = sm90.compile_sm90(*args)
    return dict(max(sm90.loops(sm90.sass_and_registers(kern)[0]), key=lambda t: t[1] - t[0])[2])


def unsupported(ms: list, names: list | None) -> list:
    """"<shape> M=<m>" of the selection that the prototype cannot run (small_mma's config there
    needs masked tiles)."""
    from kernels import small_mma
    from pq2verify.bench import plan
    return [f"{nm} M={m}" for nm, sh in plan.step_shapes().items() if not sh.dense and (not names or nm in names)
            for m in ms if not supported(sh.n, sh.k, small_mma.config(sh.n, sh.k, m, interpret=False))]


def time_shapes(ms: list, names: list | None, dest: str | None) -> None:
    """Per shape and M, this kernel (DB on and off) against small_mma (the baseline of the
    ratios and the bits): step_ab.time_shape, rotated weight copies as CUDA graphs in
    alternating rounds."""
    from decode_sweep import stream_bw
    from step_ab import time_shape
    from kernels import small_mma
    from pq2verify.bench import plan

    def gluon(db):
        def make(x, w, o, m):
            cfg = small_mma.config(w.n, w.k, m, interpret=False)
            return lambda: run(x, w, o, cfg, db=db)
        return make
    makers = {"small_mma": lambda x, w, o, m: (lambda: small_mma.run(x, w, out=o, check=False)),
              "gluon DB": gluon(True), "gluon noDB": gluon(False)}
    t0 = time.time()
    bw = stream_bw()
    res = {"bw": bw, "rows": {}}
    for name, sh in plan.step_shapes().items():
        if sh.dense or (names and name not in names):
            continue
        res["rows"].update(time_shape(name, sh, ms, makers, rounds=5, reps=10, sol=False, bw=bw, t0=t0))
        if dest:
            with open(dest, "w") as f:
                json.dump(res, f, indent=1)


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    cp = sub.add_parser("compile", help="the sm_90 loop's instructions (no GPU)")
    sm90.add_shape_args(cp)
    cp.add_argument("--db", action="store_true", help="with the register lookahead of one group")
    tp = sub.add_parser("time", help="against small_mma on a GPU")
    tp.add_argument("--m", type=positive_ints, default=[2, 16])
    tp.add_argument("--shapes", type=pq2_shape_names, default=None)
    tp.add_argument("--json", default=None)
    a = ap.parse_args()
    if a.cmd == "time":
        if any(m > 16 for m in a.m):
            ap.error(f"argument --m: small_mma serves M 1-16, got {a.m}")
        if unsupported(a.m, a.shapes):
            ap.error(f"the prototype has no masked tiles, which small_mma's config needs at {', '.join(unsupported(a.m, a.shapes))}")
        time_shapes(a.m, a.shapes, a.json)
        return
    if sm90.shape_error(a):
        ap.error(sm90.shape_error(a))
    from kernels import small_mma
    cfg = small_mma.config(a.n, a.k, a.m, interpret=False)
    if not supported(a.n, a.k, cfg):
        ap.error(f"{a.n}x{a.k}: small_mma's config {cfg} needs masked tiles, which the prototype lacks")
    ops = loop_counts(a.n, a.k, a.m, a.db)
    nbytes = cfg["BN"] * 32
    total = sum(ops.values())
    print(f"{a.n}x{a.k} M={a.m} DB={a.db}: {total} instructions a thread per group, "
          f"{total * cfg['num_warps'] / nbytes:.3f} warp-instructions per weight byte; "
          + ", ".join(f"{o} {c}" for o, c in sorted(ops.items(), key=lambda kv: -kv[1])))


if __name__ == "__main__":
    main()
