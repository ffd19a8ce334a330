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
"""
import functools

import torch
import triton
import triton.language as tl

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
def _act(a_ptr, g, g_ok, s: tl.constexpr, j, MASKED: tl.constexpr):
    """Plane s's activation words [GC, 8] of groups g."""
    ap = a_ptr + g[:, None] * 32 + s * 8 + j[None, :]
    if MASKED:
        return tl.load(ap, mask=g_ok[:, None], other=0)
    return tl.load(ap)


@triton.jit
def _group_terms(t_ptr, xs_ptr, g, g_ok, MASKED: tl.constexpr):
    """The activation sums t and scales xs [GC] of groups g."""
    if MASKED:
        return tl.load(t_ptr + g, mask=g_ok, other=0), tl.load(xs_ptr + g, mask=g_ok, other=0.0)
    return tl.load(t_ptr + g), tl.load(xs_ptr + g)


@triton.jit
def _plane_dot(w, a, plane0, s: tl.constexpr, BN: tl.constexpr, GC: tl.constexpr, INTERP: tl.constexpr):
    """Plane s's dots [BN, GC]: the DP4As of the masked code words with a, shifted down by 2s."""
    acc = common.dp4a(w & (plane0 << (2 * s)), a[None, :, :], tl.zeros([BN, GC, 8], dtype=tl.int32), INTERP, True)
    return tl.sum(acc, axis=2) >> (2 * s)


@triton.jit
def _gemv_kernel(a_ptr, xs_ptr, t_ptr, codes_ptr, scales_ptr, out_ptr, out_sn, part_ptr, count_ptr,
                 dots_ptr, d_sn, d_sg,
                 N, G, code_row, code_group, code_off, scale_row, scale_group, scale_off, per,
                 BN: tl.constexpr, GC: tl.constexpr, LOG_GC: tl.constexpr, CHUNKS: tl.constexpr,
                 DEPTH: tl.constexpr, SPLIT: tl.constexpr, MASKED: tl.constexpr, PREPARED: tl.constexpr,
                 ACT_FIRST: tl.constexpr, WRITE_DOTS: tl.constexpr, PDL: tl.constexpr, INTERP: tl.constexpr):
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
        if ACT_FIRST and PREPARED:
            # chunk i's activations are requested before chunk i + DEPTH's weights, so their
            # short L2 reads are not queued behind the ring's DRAM reads
            a0 = _act(a_ptr, g, g_ok, 0, j, MASKED)
            a1 = _act(a_ptr, g, g_ok, 1, j, MASKED)
            a2 = _act(a_ptr, g, g_ok, 2, j, MASKED)
            a3 = _act(a_ptr, g, g_ok, 3, j, MASKED)
            t, xs = _group_terms(t_ptr, xs_ptr, g, g_ok, MASKED)
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
        if ACT_FIRST and PREPARED:
            dot += _plane_dot(w, a0, plane0, 0, BN, GC, INTERP)
            dot += _plane_dot(w, a1, plane0, 1, BN, GC, INTERP)
            dot += _plane_dot(w, a2, plane0, 2, BN, GC, INTERP)
            dot += _plane_dot(w, a3, plane0, 3, BN, GC, INTERP)
        else:
            for s in tl.static_range(4):
                dot += _plane_dot(w, _act(a_ptr, g, g_ok, s, j, MASKED), plane0, s, BN, GC, INTERP)
            t, xs = _group_terms(t_ptr, xs_ptr, g, g_ok, MASKED)
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


FIELDS = {"BN": protocol.pow2(1), "GC": protocol.pow2(1), "groups_per_split": protocol.integer(1),
          "SPLIT": protocol.integer(1), "DEPTH": protocol.integer(1, 4), "ACT_FIRST": protocol.flag,
          "PDL": protocol.flag,
          "num_warps": protocol.WARPS}


def config(n: int, k: int, m: int = 1, interpret: bool | None = None) -> dict:
    """{BN, GC, groups_per_split, SPLIT, DEPTH, ACT_FIRST, PDL, num_warps} from shapes only.
    DEPTH: chunks of weight codes in flight, loaded before the PDL wait and then kept in flight.
    ACT_FIRST: on the prepared layout, a chunk's activation loads are issued before the
    look-ahead chunk's weight loads (else after them, as each plane's dots need them; the raw
    layout's byte loads would take more registers); the bits are the same. interpret: the
    interpreter's config or the GPU's (default: this process's). PDL: launch the quantize and
    GEMV kernels with programmatic dependent launch (CUDA only; ignored by the interpreter)."""
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
        depth, act_first = 2, True
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
    if not interpret:
        # a chunk's activations before the look-ahead's weights where there is a look-ahead, but
        # not on the 64-row, 16-group tiles: 140 registers instead of 128 there, one program an
        # SM instead of two (the sm_90 compile)
        act_first = triton.cdiv(per, gc) > 1 and not (bn == 64 and gc == 16)
    return (("BN", bn), ("GC", gc), ("groups_per_split", per), ("SPLIT", triton.cdiv(groups, per)),
            ("DEPTH", depth), ("ACT_FIRST", act_first), ("PDL", True), ("num_warps", warps))


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


def launch(q, xs, t, w, out, cfg, *, pdl, count, dots=None):
    """The GEMV kernel alone on quantized activations (run() quantizes first; the tuning sweep
    tools/tune/decode_sweep.py times it alone to split off the quantize kernel's share)."""
    n, g = w.n, w.groups
    bn, gc, split, per = cfg["BN"], cfg["GC"], cfg["SPLIT"], cfg["groups_per_split"]
    part = splitk.partials(out.device, split * n) if split > 1 else out
    st = w.strides
    prepared = w.layout == "prepared"
    write_dots = dots is not None
    dd = dots if write_dots else out
    ds = dots.stride() if write_dots else (0, 0, 0)
    _gemv_kernel[(triton.cdiv(n, bn), split)](
        q[0].view(torch.int32), xs[0], t[0], w.codes_i32 if prepared else w.codes_u8, w.scales_f16,
        out, out.stride(1), part, count if split > 1 else t[0], dd, ds[1], ds[2],
        n, g, st["code_row"], st["code_group"], st["code_off"],
        st["scale_row"], st["scale_group"], st["scale_off"], per,
        BN=bn, GC=gc, LOG_GC=gc.bit_length() - 1, CHUNKS=triton.cdiv(per, gc), DEPTH=cfg["DEPTH"], SPLIT=split,
        ACT_FIRST=cfg["ACT_FIRST"], MASKED=not (prepared and n % bn == 0 and per % gc == 0 and g % per == 0),
        PREPARED=prepared, WRITE_DOTS=write_dots, PDL=pdl, INTERP=common.INTERPRET,
        num_warps=cfg["num_warps"], num_stages=1, launch_pdl=pdl)
