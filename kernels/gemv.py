"""gemv: the M = 1 decode path built for the bandwidth floor of a chained decode step.

Arithmetic: plane-order Q8 activations with group sums (kernels.prepare.quantize_q8). Code word
j of a group (bytes 4j..4j+3) masked with P_s = 0x03030303 << 2s keeps plane s's codes in
place, i.e. 4^s * code as unsigned bytes {0, 4^s, 2*4^s}; an unsigned-by-signed DP4A of it with
activation word 8s + j is 4^s times the plane's dot, exactly. So
    dot_g = sum_s (sum_j dp4a_u8s8(w_j & P_s, a[8s + j])) >> 2s  -  t_g
equals int_gemv's sum (c-1)*q exactly (the shift divides a multiple of 4^s; the unsigned-codes
trick, SPEC §4). One AND and one DP4A per plane word: about half of single's instructions per
weight byte (no shift per plane, no reduce kernel).

FP32 order: a program owns BN rows and one split's groups (all G where rows alone give enough
programs), walked in chunks of GC groups. Lane c of a row keeps lane_c = lane_c +
dot_g*xs_g*ws_g (common.scale_accumulate) for g = c, c+GC, ... ascending; the GC lanes are summed
by the pairwise tree ((l0+l1)+(l2+l3))+...; split partials are summed in split order by the
tile's last program (splitk.sum_if_last), so reruns are bit-identical.

Launch (CUDA): with programmatic dependent launch (PDL). Each kernel first lets its successor
launch, loads what no earlier kernel writes (the first DEPTH chunks of weight codes and scales),
and only then waits for the previous grid (griddepcontrol.wait) before reading activations or
writing anything. Weights must therefore not be written by the kernel just before in the same
stream (they are constants in a model). The quantize kernel runs first (it also zeroes the
split-K counters).
Under TRITON_INTERPRET=1 the PDL constexpr is False and the calls compile away.

Two kernels, one arithmetic: on sm_90 with prepared weights run() launches _gluon_kernel, the
same tiles, dots and FP32 order in Gluon with explicit register layouts, so that each thread
holds whole groups (eight code words): a group's DP4As chain through their accumulator, one
chain per plane, with no cross-thread sum and no shared-memory exchange in the loop (0.6-0.8x
the Triton kernel's instructions per weight byte in the sm_90 compile). Everywhere else (the
interpreter, raw weights, other GPUs) it launches _gemv_kernel, plain Triton, which is the Gluon
kernel's twin: tests/test_gemv_gluon.py compares the two bit for bit on the GPU. The config
field GLUON (False: the twin everywhere) lets a test or an A/B pick the twin on sm_90 too.
"""
import functools

import torch
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from . import common, prepare, splitk
from kernels import config as protocol, validate


@triton.jit
def _words(codes_ptr, rn, g0, GCW: tl.constexpr, mask, G, code_row, code_group, code_off,
           PREPARED: tl.constexpr, MASKED: tl.constexpr):
    """int32 code words [BN, GC*8] of rows rn, groups g0 .. g0+GC-1 (word j of group g at
    column 8(g-g0)+j). Loaded as one [BN, GC*8] block: a row's chunk is contiguous in the
    prepared layout, so a warp reads whole 128-byte lines (a [BN, GC, 8] load spread rows across
    each warp instruction and doubled the L1 wavefronts)."""
    c = tl.arange(0, GCW)
    if PREPARED:
        wp = codes_ptr + rn[:, None] * (G * 8) + (g0 * 8 + c)[None, :]
        return tl.load(wp, mask=mask, other=0)
    # raw blocks are 34 bytes, so words are unaligned: four byte loads each
    bp = (codes_ptr + code_off + rn[:, None] * code_row + (g0 + c // 8)[None, :] * code_group
          + 4 * (c % 8)[None, :])
    w = tl.load(bp, mask=mask, other=0).to(tl.int32)
    for i in tl.static_range(1, 4):
        w = w | (tl.load(bp + i, mask=mask, other=0).to(tl.int32) << (8 * i))
    return w


@triton.jit
def _chunk(codes_ptr, scales_ptr, rn, n_ok, g_begin, c, g_end, G, code_row, code_group, code_off,
           scale_row, scale_group, scale_off, GC: tl.constexpr, CHUNKS: tl.constexpr,
           PREPARED: tl.constexpr, MASKED: tl.constexpr):
    """Code words [BN, GC*8] and fp16 scales [BN, GC] of rows rn, chunk c of the split starting
    at group g_begin (groups at or past g_end read as zero). A chunk c >= CHUNKS (a look-ahead
    past the split's end) is not read at all: its loads are predicated off."""
    gi = tl.arange(0, GC)
    cw = tl.arange(0, GC * 8)
    live = c < CHUNKS
    g0 = g_begin + c * GC
    if MASKED:
        mw = n_ok[:, None] & (g0 + cw // 8 < g_end)[None, :] & live
    else:
        mw = live    # one scalar predicate: the loads stay whole 128-bit vectors
    w = _words(codes_ptr, rn, g0, GC * 8, mw, G, code_row, code_group, code_off, PREPARED, MASKED)
    sp = scales_ptr + scale_off + rn[:, None] * scale_row + (g0 + gi)[None, :] * scale_group
    if MASKED:
        ws = tl.load(sp, mask=n_ok[:, None] & (g0 + gi < g_end)[None, :] & live, other=0.0)
    else:
        ws = tl.load(sp, mask=live, other=0.0)
    return w, ws


@triton.jit
def _gemv_kernel(a_ptr, xs_ptr, t_ptr, codes_ptr, scales_ptr, out_ptr, out_sn, part_ptr, count_ptr,
                 dots_ptr, d_sn, d_sg,
                 N, G, code_row, code_group, code_off, scale_row, scale_group, scale_off, per,
                 BN: tl.constexpr, GC: tl.constexpr, LOG_GC: tl.constexpr, CHUNKS: tl.constexpr,
                 DEPTH: tl.constexpr, SPLIT: tl.constexpr, MASKED: tl.constexpr, PREPARED: tl.constexpr,
                 WRITE_DOTS: tl.constexpr, PDL: tl.constexpr, INTERP: tl.constexpr):
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    tile = tl.program_id(0)
    pid_k = tl.program_id(1)
    rn = tile * BN + tl.arange(0, BN)
    n_ok = rn < N
    gi = tl.arange(0, GC)
    j = tl.arange(0, 8)
    g_begin = pid_k * per
    g_end = tl.minimum(g_begin + per, G)
    # The first DEPTH chunks' codes and scales are constants: loaded before the wait for the
    # previous kernel (PDL), so they are in flight while it drains. In the loop the same DEPTH
    # chunks stay in flight: a register ring b1 (next to compute) .. bDEPTH (last loaded).
    w1, s1 = _chunk(codes_ptr, scales_ptr, rn, n_ok, g_begin, 0, g_end, G, code_row, code_group,
                    code_off, scale_row, scale_group, scale_off, GC, CHUNKS, PREPARED, MASKED)
    if DEPTH >= 2:
        w2, s2 = _chunk(codes_ptr, scales_ptr, rn, n_ok, g_begin, 1, g_end, G, code_row, code_group,
                        code_off, scale_row, scale_group, scale_off, GC, CHUNKS, PREPARED, MASKED)
    if DEPTH >= 3:
        w3, s3 = _chunk(codes_ptr, scales_ptr, rn, n_ok, g_begin, 2, g_end, G, code_row, code_group,
                        code_off, scale_row, scale_group, scale_off, GC, CHUNKS, PREPARED, MASKED)
    if DEPTH >= 4:
        w4, s4 = _chunk(codes_ptr, scales_ptr, rn, n_ok, g_begin, 3, g_end, G, code_row, code_group,
                        code_off, scale_row, scale_group, scale_off, GC, CHUNKS, PREPARED, MASKED)
    if PDL:
        tl.extra.cuda.gdc_wait()
    lanes = tl.zeros([BN, GC], dtype=tl.float32)
    plane0 = tl.full([], 0x03030303, tl.int32)   # shifted in int32: 0xC0C0C0C0 wraps
    # constexpr trip count: runtime loop bounds break Triton 3.6's interpreter under numpy >= 2.4
    for i in range(0, CHUNKS):
        g0 = g_begin + i * GC
        g = g0 + gi
        g_ok = g < g_end
        w = tl.reshape(w1, (BN, GC, 8))
        ws = s1.to(tl.float32)
        # the ring moves on by one; chunk i + DEPTH is loaded while chunk i is computed
        if DEPTH == 1:
            w1, s1 = _chunk(codes_ptr, scales_ptr, rn, n_ok, g_begin, i + 1, g_end, G, code_row, code_group,
                            code_off, scale_row, scale_group, scale_off, GC, CHUNKS, PREPARED, MASKED)
        if DEPTH == 2:
            w1, s1 = w2, s2
            w2, s2 = _chunk(codes_ptr, scales_ptr, rn, n_ok, g_begin, i + 2, g_end, G, code_row, code_group,
                            code_off, scale_row, scale_group, scale_off, GC, CHUNKS, PREPARED, MASKED)
        if DEPTH == 3:
            w1, s1 = w2, s2
            w2, s2 = w3, s3
            w3, s3 = _chunk(codes_ptr, scales_ptr, rn, n_ok, g_begin, i + 3, g_end, G, code_row, code_group,
                            code_off, scale_row, scale_group, scale_off, GC, CHUNKS, PREPARED, MASKED)
        if DEPTH == 4:
            w1, s1 = w2, s2
            w2, s2 = w3, s3
            w3, s3 = w4, s4
            w4, s4 = _chunk(codes_ptr, scales_ptr, rn, n_ok, g_begin, i + 4, g_end, G, code_row, code_group,
                            code_off, scale_row, scale_group, scale_off, GC, CHUNKS, PREPARED, MASKED)
        dot = tl.zeros([BN, GC], dtype=tl.int32)
        for s in tl.static_range(4):
            ap = a_ptr + g[:, None] * 32 + s * 8 + j[None, :]
            if MASKED:
                a = tl.load(ap, mask=g_ok[:, None], other=0)
            else:
                a = tl.load(ap)                                          # [GC, 8] words
            acc = common.dp4a(w & (plane0 << (2 * s)), a[None, :, :],
                              tl.zeros([BN, GC, 8], dtype=tl.int32), INTERP, True)
            dot += tl.sum(acc, axis=2) >> (2 * s)
        if MASKED:
            t = tl.load(t_ptr + g, mask=g_ok, other=0)
            xs = tl.load(xs_ptr + g, mask=g_ok, other=0.0)
        else:
            t = tl.load(t_ptr + g)
            xs = tl.load(xs_ptr + g)
        dot = dot - t[None, :]
        lanes = common.scale_accumulate(lanes, dot, xs[None, :], ws)
        if WRITE_DOTS:
            tl.store(dots_ptr + rn[:, None] * d_sn + g[None, :] * d_sg, dot, mask=n_ok[:, None] & g_ok[None, :])
    y = common.lane_tree(lanes, BN, GC, LOG_GC)
    if SPLIT == 1:
        tl.store(out_ptr + rn * out_sn, prepare.to_out(y, out_ptr.dtype.element_ty, INTERP), mask=n_ok)
    else:
        # split-K reduced in this kernel: every program stores its partial; the last of a tile
        # to arrive (the counter, zeroed by this call's quantize kernel) sums them in split order
        tl.store(part_ptr + pid_k * N + rn, y, mask=n_ok)
        splitk.sum_if_last(part_ptr, count_ptr, tile, rn, n_ok, N, out_ptr, rn * out_sn, SPLIT, INTERP)


# --- the Gluon kernel (sm_90, prepared weights) --------------------------------------------

@gluon.jit
def _gl_launch_dependents():
    gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [], dtype=gl.int32,
                              is_pure=False, pack=1)


@gluon.jit
def _gl_wait():
    gl.inline_asm_elementwise("griddepcontrol.wait; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _gl_dp4a(a, b, acc):
    # unsigned code-plane bytes (up to 0xC0) by signed activation bytes
    return gl.inline_asm_elementwise("dp4a.u32.s32 $0, $1, $2, $3;", "=r,r,r,r", [a, b, acc],
                                     dtype=gl.int32, is_pure=True, pack=1)


@gluon.jit
def _gl_words(x, B0: gl.constexpr, B1: gl.constexpr):
    """[B0, B1, 8] with the 8 in one thread -> its eight [B0, B1] slices (register renaming, no
    data movement); every operand goes through the same splits, so slice i pairs word i with
    word i."""
    e, o = gl.split(gl.reshape(x, [B0, B1, 4, 2]))
    e0, e1 = gl.split(gl.reshape(e, [B0, B1, 2, 2]))
    o0, o1 = gl.split(gl.reshape(o, [B0, B1, 2, 2]))
    w0, w4 = gl.split(e0)
    w2, w6 = gl.split(e1)
    w1, w5 = gl.split(o0)
    w3, w7 = gl.split(o1)
    return (w0, w1, w2, w3, w4, w5, w6, w7)


@gluon.jit
def _gl_chunk(codes_ptr, scales_ptr, r3, c3, j3, r2, c2, g_begin, c, g_end, G, scale_off,
              GC: gl.constexpr, CHUNKS: gl.constexpr, MASKED: gl.constexpr):
    """Code words [BN, GC, 8] and fp16 scales [BN, GC] of chunk c (as _chunk; rows are clamped
    in range by the caller, groups at or past g_end and chunks past the split read nothing)."""
    g0 = g_begin + c * GC
    live = c < CHUNKS
    wp = codes_ptr + r3 * (G * 8) + (g0 + c3) * 8 + j3
    sp = scales_ptr + scale_off + r2 * G + (g0 + c2)
    if MASKED:
        w = gl.load(wp, mask=(r3 >= 0) & (g0 + c3 < g_end) & live, other=0)
        ws = gl.load(sp, mask=(r2 >= 0) & (g0 + c2 < g_end) & live, other=0.0)
    else:
        # a chunk past the split is never used: no fill for it
        w = gl.load(wp, mask=live)
        ws = gl.load(sp, mask=live)
    return w, ws


@gluon.jit
def _gl_step(lanes, w, s1, g0, g_end, a_ptr, t_ptr, xs_ptr, dots_ptr, d_sn, d_sg, r2, n_ok, c3, j3, cg,
             BN: gl.constexpr, GC: gl.constexpr, L2: gl.constexpr, MASKED: gl.constexpr,
             WRITE_DOTS: gl.constexpr):
    """lanes + one chunk's groups folded in: dot_g = sum_s (sum_j dp4a(word_j & P_s, a[8s+j])) >> 2s
    - t_g, one DP4A chain per plane and row, then lane c += dot * xs * ws."""
    plane0 = 0x03030303
    ws = s1.to(gl.float32)
    wj = _gl_words(w, BN, GC)
    dot = gl.zeros([BN, GC], gl.int32, L2)
    for s in gl.static_range(4):
        # plane s's activation words of these groups, held once for the thread's R rows
        ap = a_ptr + (g0 + c3) * 32 + s * 8 + j3
        if MASKED:
            a = gl.load(ap, mask=g0 + c3 < g_end, other=0)
        else:
            a = gl.load(ap)
        aj = _gl_words(gl.broadcast(a, w)[0], BN, GC)
        d = _gl_dp4a(wj[0] & (plane0 << (2 * s)), aj[0], gl.zeros_like(wj[0]))
        for j in gl.static_range(1, 8):
            d = _gl_dp4a(wj[j] & (plane0 << (2 * s)), aj[j], d)
        dot += gl.convert_layout(d, L2, assert_trivial=True) >> (2 * s)
    g = g0 + cg
    if MASKED:
        t = gl.load(t_ptr + g, mask=g < g_end, other=0)
        xs = gl.load(xs_ptr + g, mask=g < g_end, other=0.0)
    else:
        t = gl.load(t_ptr + g)
        xs = gl.load(xs_ptr + g)
    dot = dot - gl.expand_dims(t, 0)
    # common.scale_accumulate's expression, term for term
    lanes = lanes + dot.to(gl.float32) * gl.expand_dims(xs, 0) * ws
    if WRITE_DOTS:
        gl.store(dots_ptr + r2 * d_sn + gl.expand_dims(g, 0) * d_sg, dot,
                 mask=n_ok & gl.expand_dims(g < g_end, 0))
    return lanes


@gluon.jit
def _gluon_kernel(a_ptr, xs_ptr, t_ptr, codes_ptr, scales_ptr, out_ptr, out_sn, part_ptr, count_ptr,
                  dots_ptr, d_sn, d_sg, N, G, scale_off, per,
                  BN: gl.constexpr, GC: gl.constexpr, LOG_GC: gl.constexpr, CHUNKS: gl.constexpr,
                  DEPTH: gl.constexpr, SPLIT: gl.constexpr, MASKED: gl.constexpr, WRITE_DOTS: gl.constexpr,
                  PDL: gl.constexpr, num_warps: gl.constexpr):
    # Threads over [rows, groups] of a chunk, each holding R rows x one group x 8 words (two
    # 16-byte loads a row); a row's GC groups are GC consecutive lanes of one warp. Rows of a
    # tile narrower than the layout repeat in threads (loads and stores of equal values).
    TG: gl.constexpr = GC if GC < 32 else 32
    TR: gl.constexpr = 32 // TG
    R: gl.constexpr = BN // (TR * num_warps) if BN > TR * num_warps else 1
    L3: gl.constexpr = gl.BlockedLayout([R, GC // TG, 8], [TR, TG, 1], [num_warps, 1, 1], [2, 1, 0])
    L2: gl.constexpr = gl.SliceLayout(2, L3)
    if PDL:
        _gl_launch_dependents()
    tile = gl.program_id(0)
    pid_k = gl.program_id(1)
    rn = tile * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, L2))
    cg = gl.arange(0, GC, layout=gl.SliceLayout(0, L2))
    jj = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(1, L3)))
    n_ok = gl.expand_dims(rn < N, 1)
    if MASKED:
        rn = gl.minimum(rn, N - 1)     # rows past N read row N - 1 and are never stored
    r2 = gl.expand_dims(rn, 1)
    c2 = gl.expand_dims(cg, 0)
    r3 = gl.expand_dims(r2, 2)
    c3 = gl.expand_dims(c2, 2)
    j3 = gl.expand_dims(gl.expand_dims(jj, 0), 1)
    g_begin = pid_k * per
    g_end = gl.minimum(g_begin + per, G)
    # the first DEPTH chunks (constants) before the wait; then a ring b1 (next) .. bDEPTH
    w1, s1 = _gl_chunk(codes_ptr, scales_ptr, r3, c3, j3, r2, c2, g_begin, 0, g_end, G, scale_off, GC, CHUNKS,
                       MASKED)
    if DEPTH >= 2:
        w2, s2 = _gl_chunk(codes_ptr, scales_ptr, r3, c3, j3, r2, c2, g_begin, 1, g_end, G, scale_off, GC,
                           CHUNKS, MASKED)
    if DEPTH >= 3:
        w3, s3 = _gl_chunk(codes_ptr, scales_ptr, r3, c3, j3, r2, c2, g_begin, 2, g_end, G, scale_off, GC,
                           CHUNKS, MASKED)
    if DEPTH >= 4:
        w4, s4 = _gl_chunk(codes_ptr, scales_ptr, r3, c3, j3, r2, c2, g_begin, 3, g_end, G, scale_off, GC,
                           CHUNKS, MASKED)
    if PDL:
        _gl_wait()
    lanes = gl.zeros([BN, GC], gl.float32, L2)
    if DEPTH == 1:
        # two chunks a trip: the next chunk's load lands in registers the trip frees, so the ring
        # needs no copies (a one-chunk trip moved every word once a chunk)
        for i2 in range(CHUNKS // 2):
            i = 2 * i2
            wb, sb = _gl_chunk(codes_ptr, scales_ptr, r3, c3, j3, r2, c2, g_begin, i + 1, g_end, G, scale_off,
                               GC, CHUNKS, MASKED)
            lanes = _gl_step(lanes, w1, s1, g_begin + i * GC, g_end, a_ptr, t_ptr, xs_ptr, dots_ptr, d_sn, d_sg,
                             r2, n_ok, c3, j3, cg, BN, GC, L2, MASKED, WRITE_DOTS)
            w1, s1 = _gl_chunk(codes_ptr, scales_ptr, r3, c3, j3, r2, c2, g_begin, i + 2, g_end, G, scale_off,
                               GC, CHUNKS, MASKED)
            lanes = _gl_step(lanes, wb, sb, g_begin + (i + 1) * GC, g_end, a_ptr, t_ptr, xs_ptr, dots_ptr, d_sn,
                             d_sg, r2, n_ok, c3, j3, cg, BN, GC, L2, MASKED, WRITE_DOTS)
        if CHUNKS % 2 == 1:
            lanes = _gl_step(lanes, w1, s1, g_begin + (CHUNKS - 1) * GC, g_end, a_ptr, t_ptr, xs_ptr, dots_ptr,
                             d_sn, d_sg, r2, n_ok, c3, j3, cg, BN, GC, L2, MASKED, WRITE_DOTS)
    for i in range(CHUNKS if DEPTH > 1 else 0):
        g0 = g_begin + i * GC
        w, ws1 = w1, s1
        if DEPTH == 2:
            w1, s1 = w2, s2
            w2, s2 = _gl_chunk(codes_ptr, scales_ptr, r3, c3, j3, r2, c2, g_begin, i + 2, g_end, G, scale_off,
                               GC, CHUNKS, MASKED)
        if DEPTH == 3:
            w1, s1 = w2, s2
            w2, s2 = w3, s3
            w3, s3 = _gl_chunk(codes_ptr, scales_ptr, r3, c3, j3, r2, c2, g_begin, i + 3, g_end, G, scale_off,
                               GC, CHUNKS, MASKED)
        if DEPTH == 4:
            w1, s1 = w2, s2
            w2, s2 = w3, s3
            w3, s3 = w4, s4
            w4, s4 = _gl_chunk(codes_ptr, scales_ptr, r3, c3, j3, r2, c2, g_begin, i + 4, g_end, G, scale_off,
                               GC, CHUNKS, MASKED)
        lanes = _gl_step(lanes, w, ws1, g0, g_end, a_ptr, t_ptr, xs_ptr, dots_ptr, d_sn, d_sg, r2, n_ok, c3, j3,
                         cg, BN, GC, L2, MASKED, WRITE_DOTS)
    _gl_finish(lanes, out_ptr, out_sn, part_ptr, count_ptr, tile, pid_k, N, BN, GC, LOG_GC, SPLIT, num_warps)


@gluon.jit
def _gl_finish(lanes, out_ptr, out_sn, part_ptr, count_ptr, tile, pid_k, N, BN: gl.constexpr, GC: gl.constexpr,
               LOG_GC: gl.constexpr, SPLIT: gl.constexpr, num_warps: gl.constexpr):
    # common.lane_tree's pairwise order, in one thread per row
    LR: gl.constexpr = gl.BlockedLayout([1, GC], [32, 1], [num_warps, 1], [1, 0])
    y = gl.convert_layout(lanes, LR)
    for r in gl.static_range(LOG_GC):
        lo, hi = gl.split(gl.reshape(y, [BN, GC >> (r + 1), 2]))
        y = lo + hi
    y = gl.reshape(y, [BN])
    ro = tile * BN + gl.arange(0, BN, layout=y.type.layout)
    ok = ro < N
    if SPLIT == 1:
        gl.store(out_ptr + ro * out_sn, y.to(out_ptr.dtype.element_ty), mask=ok)
    else:
        # splitk.sum_if_last, step for step
        gl.store(part_ptr + pid_k * N + ro, y, mask=ok)
        gl.thread_barrier()
        arrived = gl.atomic_add(count_ptr + tile, 1, sem="acq_rel", scope="gpu")
        if arrived == SPLIT - 1:
            gl.thread_barrier()
            acc = gl.load(part_ptr + ro, mask=ok, other=0.0, cache_modifier=".cg")
            for sp in gl.static_range(1, SPLIT):
                acc = acc + gl.load(part_ptr + sp * N + ro, mask=ok, other=0.0, cache_modifier=".cg")
            gl.store(out_ptr + ro * out_sn, acc.to(out_ptr.dtype.element_ty), mask=ok)
            gl.store(count_ptr + tile, 0)


# --- the pair layout: a group's eight words over two lanes ------------------------------------

@gluon.jit
def _gp_words(x, B0: gl.constexpr, B1: gl.constexpr):
    """[B0, B1, 2, 4] with the 4 in one thread -> its four [B0, B1, 2] slices."""
    e, o = gl.split(gl.reshape(x, [B0, B1, 2, 2, 2]))
    w0, w2 = gl.split(e)
    w1, w3 = gl.split(o)
    return (w0, w1, w2, w3)


@gluon.jit
def _gp_chunk(codes_ptr, scales_ptr, r4, c4, j4, r2, c2, g_begin, c, g_end, G, scale_off,
              GC: gl.constexpr, CHUNKS: gl.constexpr, MASKED: gl.constexpr):
    g0 = g_begin + c * GC
    live = c < CHUNKS
    wp = codes_ptr + r4 * (G * 8) + (g0 + c4) * 8 + j4
    sp = scales_ptr + scale_off + r2 * G + (g0 + c2)
    if MASKED:
        w = gl.load(wp, mask=(r4 >= 0) & (g0 + c4 < g_end) & live, other=0)
        ws = gl.load(sp, mask=(r2 >= 0) & (g0 + c2 < g_end) & live, other=0.0)
    else:
        w = gl.load(wp, mask=live)
        ws = gl.load(sp, mask=live)
    return w, ws


@gluon.jit
def _gp_step(lanes, w, s1, g0, g_end, a_ptr, t_ptr, xs_ptr, dots_ptr, d_sn, d_sg, r2, n_ok, c4, j4, cg,
             BN: gl.constexpr, GC: gl.constexpr, L2: gl.constexpr, MASKED: gl.constexpr,
             WRITE_DOTS: gl.constexpr):
    plane0 = 0x03030303
    ws = s1.to(gl.float32)
    for s in gl.static_range(4):
        ap = a_ptr + (g0 + c4) * 32 + s * 8 + j4
        if MASKED:
            a = gl.load(ap, mask=g0 + c4 < g_end, other=0)
        else:
            a = gl.load(ap)
        wm = _gp_words(w & (plane0 << (2 * s)), BN, GC)
        aj = _gp_words(gl.broadcast(a, w)[0], BN, GC)
        d = _gl_dp4a(wm[0], aj[0], gl.zeros_like(wm[0]))
        for j in gl.static_range(1, 4):
            d = _gl_dp4a(wm[j], aj[j], d)
        if s == 0:
            half = d
        else:
            half += d >> (2 * s)
    dot = gl.convert_layout(gl.sum(half, axis=2), L2)
    g = g0 + cg
    if MASKED:
        t = gl.load(t_ptr + g, mask=g < g_end, other=0)
        xs = gl.load(xs_ptr + g, mask=g < g_end, other=0.0)
    else:
        t = gl.load(t_ptr + g)
        xs = gl.load(xs_ptr + g)
    dot = dot - gl.expand_dims(t, 0)
    lanes = lanes + dot.to(gl.float32) * gl.expand_dims(xs, 0) * ws
    if WRITE_DOTS:
        gl.store(dots_ptr + r2 * d_sn + gl.expand_dims(g, 0) * d_sg, dot,
                 mask=n_ok & gl.expand_dims(g < g_end, 0))
    return lanes


@gluon.jit
def _gluon_pair_kernel(a_ptr, xs_ptr, t_ptr, codes_ptr, scales_ptr, out_ptr, out_sn, part_ptr, count_ptr,
                       dots_ptr, d_sn, d_sg, N, G, scale_off, per,
                       BN: gl.constexpr, GC: gl.constexpr, LOG_GC: gl.constexpr, CHUNKS: gl.constexpr,
                       DEPTH: gl.constexpr, SPLIT: gl.constexpr, MASKED: gl.constexpr,
                       WRITE_DOTS: gl.constexpr, PDL: gl.constexpr, num_warps: gl.constexpr):
    # as _gluon_kernel, but a group's eight words lie over two neighbouring lanes (four each),
    # so each 16-byte load instruction of a warp reads whole 32-byte sectors (_gluon_kernel's
    # read half of each sector it touches, twice); the two halves' dots meet in one shuffle.
    # DEPTH is not read: always DEPTH 1's two-chunk trip.
    TG: gl.constexpr = GC if GC < 16 else 16
    TR: gl.constexpr = 16 // TG
    R: gl.constexpr = BN // (TR * num_warps) if BN > TR * num_warps else 1
    L4: gl.constexpr = gl.BlockedLayout([R, GC // TG, 1, 4], [TR, TG, 2, 1], [num_warps, 1, 1, 1], [3, 2, 1, 0])
    L2: gl.constexpr = gl.SliceLayout(2, gl.SliceLayout(3, L4))
    if PDL:
        _gl_launch_dependents()
    tile = gl.program_id(0)
    pid_k = gl.program_id(1)
    rn = tile * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, L2))
    cg = gl.arange(0, GC, layout=gl.SliceLayout(0, L2))
    hh = gl.arange(0, 2, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(3, L4))))
    ii = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(2, L4))))
    n_ok = gl.expand_dims(rn < N, 1)
    if MASKED:
        rn = gl.minimum(rn, N - 1)
    r2 = gl.expand_dims(rn, 1)
    c2 = gl.expand_dims(cg, 0)
    r4 = gl.expand_dims(gl.expand_dims(r2, 2), 3)
    c4 = gl.expand_dims(gl.expand_dims(c2, 2), 3)
    j4 = (gl.expand_dims(gl.expand_dims(gl.expand_dims(hh, 0), 1), 3) * 4
          + gl.expand_dims(gl.expand_dims(gl.expand_dims(ii, 0), 1), 2))
    g_begin = pid_k * per
    g_end = gl.minimum(g_begin + per, G)
    w1, s1 = _gp_chunk(codes_ptr, scales_ptr, r4, c4, j4, r2, c2, g_begin, 0, g_end, G, scale_off, GC, CHUNKS,
                       MASKED)
    if PDL:
        _gl_wait()
    lanes = gl.zeros([BN, GC], gl.float32, L2)
    for i2 in range(CHUNKS // 2):
        i = 2 * i2
        wb, sb = _gp_chunk(codes_ptr, scales_ptr, r4, c4, j4, r2, c2, g_begin, i + 1, g_end, G, scale_off,
                           GC, CHUNKS, MASKED)
        lanes = _gp_step(lanes, w1, s1, g_begin + i * GC, g_end, a_ptr, t_ptr, xs_ptr, dots_ptr, d_sn, d_sg,
                         r2, n_ok, c4, j4, cg, BN, GC, L2, MASKED, WRITE_DOTS)
        w1, s1 = _gp_chunk(codes_ptr, scales_ptr, r4, c4, j4, r2, c2, g_begin, i + 2, g_end, G, scale_off,
                           GC, CHUNKS, MASKED)
        lanes = _gp_step(lanes, wb, sb, g_begin + (i + 1) * GC, g_end, a_ptr, t_ptr, xs_ptr, dots_ptr, d_sn,
                         d_sg, r2, n_ok, c4, j4, cg, BN, GC, L2, MASKED, WRITE_DOTS)
    if CHUNKS % 2 == 1:
        lanes = _gp_step(lanes, w1, s1, g_begin + (CHUNKS - 1) * GC, g_end, a_ptr, t_ptr, xs_ptr, dots_ptr,
                         d_sn, d_sg, r2, n_ok, c4, j4, cg, BN, GC, L2, MASKED, WRITE_DOTS)
    _gl_finish(lanes, out_ptr, out_sn, part_ptr, count_ptr, tile, pid_k, N, BN, GC, LOG_GC, SPLIT, num_warps)



FIELDS = {"BN": protocol.pow2(1), "GC": protocol.pow2(1), "groups_per_split": protocol.integer(1),
          "SPLIT": protocol.integer(1), "DEPTH": protocol.integer(1, 4), "PDL": protocol.flag,
          "GLUON": protocol.flag, "PAIR": protocol.flag, "num_warps": protocol.WARPS}


def config(n: int, k: int, m: int = 1, interpret: bool | None = None) -> dict:
    """{BN, GC, groups_per_split, SPLIT, DEPTH, PDL, GLUON, num_warps} from shapes only. DEPTH:
    chunks of weight codes in flight, loaded before the PDL wait and then kept in flight.
    interpret: the interpreter's config or the GPU's (default: this process's). PDL: launch the
    quantize and GEMV kernels with programmatic dependent launch (CUDA only; ignored by the
    interpreter). GLUON: the Gluon kernel where it runs (sm_90, prepared weights), else its
    twin; False: the twin everywhere (the same bits). PAIR: the Gluon kernel with a group's
    words over two lanes (_gluon_pair_kernel; the same bits)."""
    return dict(_config(n, k, common.INTERPRET if interpret is None else bool(interpret)))


def configs(interpret: bool) -> list[dict]:
    """Every distinct config config() picks for the interpreter or the GPU (kernels.config)."""
    return protocol.sweep("gemv", lambda n, k, m: config(n, k, m, interpret))


@functools.lru_cache(maxsize=None)
def _config(n: int, k: int, interpret: bool) -> tuple:
    groups = k // 128
    if interpret:
        # the interpreter pays per program: wide row tiles; GC = 2 and two splits keep several
        # chunks, a masked tail and the in-kernel split reduction in every small case; DEPTH = 2
        # keeps a ring shift and a look-ahead past the split's end in them too
        bn, gc, split, warps = min(128, max(8, triton.next_power_of_2(n))), 2, 2 if groups >= 4 else 1, 4
        depth = 2
    else:
        # Measured on the H200 (tools/tune/decode_sweep.py, CUDA graphs, weights rotated past L2;
        # results/2026-11-30-decode-gemv/): 4-8 warps whose warp instructions each read whole 128-byte row
        # lines; rows beyond 4 * num_warps repeat in a thread and reuse its activation words;
        # GC = 16 (512 bytes a row a chunk) pays at 14-16K rows and on the 17408-deep down
        # projection, GC = 8 elsewhere; the 5120-row shapes need split-K for enough programs.
        gc = 8 if groups >= 8 else triton.next_power_of_2(groups)
        if n >= 32768:
            # gate_up (34816 rows) too: 32-row tiles of 4 warps run 6 programs an SM
            # (results/2026-12-02-decode-levers/)
            bn, warps = 32, 4
        elif n >= 12288:
            bn, warps = 64, 8
            if n < 32768 and groups >= 16:
                gc = 16
        elif groups >= 96:
            bn, warps, gc = 16, 4, 16
        else:
            bn, warps = 64, 8
        row_tiles = triton.cdiv(n, bn)
        # DEPTH 2 paid on the short split grids of 64-row tiles and lost elsewhere (registers:
        # fewer programs an SM; results/2026-12-02-decode-levers/)
        depth = 2 if bn == 64 and n < 12288 else 1
        split = 1
        while n < 12288 and row_tiles * split < 640 and groups // (split * 2) >= gc:
            split *= 2
    per = triton.cdiv(groups, split)
    return (("BN", bn), ("GC", gc), ("groups_per_split", per), ("SPLIT", triton.cdiv(groups, per)),
            ("DEPTH", depth), ("PDL", True), ("GLUON", not interpret), ("PAIR", False), ("num_warps", warps))


def _resolve(n, k, interpret, cfg) -> dict:
    c = protocol.force("gemv", config(n, k, 1, interpret), cfg, FIELDS)
    if cfg is not None:
        protocol.splits("gemv", k // 128, c["groups_per_split"], c["SPLIT"])
    return c


def fold(n: int, k: int, m: int = 1, interpret: bool | None = None, config: dict | None = None) -> dict:
    """The FP32 order: split s covers groups [s*per, min((s+1)*per, G)); in it lane c folds
    groups s*per + c, + c + GC, ... ascending; lanes are summed pairwise ((l0+l1)+(l2+l3))+...;
    splits are summed ((p0+p1)+p2)+... by the last program of the tile."""
    c = _resolve(n, k, interpret, config)
    return dict(lanes=c["GC"], groups_per_split=c["groups_per_split"], splits=c["SPLIT"])


def run(x, w, *, out=None, dots=None, check=True, config=None):
    out = validate.kernel_out(__name__, x, w, out, dots, check)
    (m, k), n = x.shape, out.shape[1]
    if m == 0:
        return out
    cfg = _resolve(n, k, None, config)
    split = cfg["SPLIT"]
    row_tiles = triton.cdiv(n, cfg["BN"])
    pdl = cfg["PDL"] and not common.INTERPRET and x.device.type == "cuda"
    # split-K: per-call partials and arrival counters (never shared between calls or graphs);
    # the quantize kernel zeroes the counters before this call's GEMV reads them
    count = torch.empty(row_tiles, dtype=torch.int32, device=x.device) if split > 1 else None
    q, xs, t = prepare.quantize_q8(x, order="plane", pdl=pdl, zero=count)
    launch(q, xs, t, w, out, cfg, pdl=pdl, count=count, dots=dots)
    return out


def gluon_runs(w, cfg, device) -> bool:
    """Whether run() launches the Gluon kernel for weight w under cfg on `device` (else the twin)."""
    return bool(cfg.get("GLUON")) and w.layout == "prepared" and _hopper(device)


def _hopper(device) -> bool:
    if common.INTERPRET or device.type != "cuda":
        return False
    return _capability(device.index if device.index is not None else torch.cuda.current_device())[0] == 9


@functools.lru_cache(maxsize=None)
def _capability(index: int):
    return torch.cuda.get_device_capability(index)


def launch(q, xs, t, w, out, cfg, *, pdl, count, dots=None):
    """The GEMV kernel alone on quantized activations (run() quantizes first; the tuning sweep
    tools/tune/decode_sweep.py times it alone to split off the quantize kernel's share): the
    Gluon kernel where gluon_runs(), else the twin."""
    n, g = w.n, w.groups
    bn, gc, split, per = cfg["BN"], cfg["GC"], cfg["SPLIT"], cfg["groups_per_split"]
    part = splitk.partials(out.device, split * n) if split > 1 else out
    st = w.strides
    prepared = w.layout == "prepared"
    write_dots = dots is not None
    dd = dots if write_dots else out
    ds = dots.stride() if write_dots else (0, 0, 0)
    masked = not (prepared and n % bn == 0 and per % gc == 0 and g % per == 0)
    if gluon_runs(w, cfg, out.device):
        kern = _gluon_pair_kernel if cfg.get("PAIR") else _gluon_kernel
        kern[(triton.cdiv(n, bn), split)](
            q[0].view(torch.int32), xs[0], t[0], w.codes_i32, w.scales_f16, out, out.stride(1), part,
            count if split > 1 else t[0], dd, ds[1], ds[2], n, g, st["scale_off"], per,
            BN=bn, GC=gc, LOG_GC=gc.bit_length() - 1, CHUNKS=triton.cdiv(per, gc), DEPTH=cfg["DEPTH"],
            SPLIT=split, MASKED=masked, WRITE_DOTS=write_dots, PDL=pdl, num_warps=cfg["num_warps"],
            launch_pdl=pdl)
        return
    _gemv_kernel[(triton.cdiv(n, bn), split)](
        q[0].view(torch.int32), xs[0], t[0], w.codes_i32 if prepared else w.codes_u8, w.scales_f16,
        out, out.stride(1), part, count if split > 1 else t[0], dd, ds[1], ds[2],
        n, g, st["code_row"], st["code_group"], st["code_off"],
        st["scale_row"], st["scale_group"], st["scale_off"], per,
        BN=bn, GC=gc, LOG_GC=gc.bit_length() - 1, CHUNKS=triton.cdiv(per, gc), DEPTH=cfg["DEPTH"], SPLIT=split,
        MASKED=masked, PREPARED=prepared, WRITE_DOTS=write_dots, PDL=pdl, INTERP=common.INTERPRET,
        num_warps=cfg["num_warps"], num_stages=1, launch_pdl=pdl)
