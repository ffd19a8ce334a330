"""gemv_rows: M = 2-16 decode with gemv's arithmetic, each weight word read once for all M rows.

Arithmetic (kernels/gemv.py): plane-order Q8 activations with group sums; code word j of a group
masked with P_s = 0x03030303 << 2s is 4^s * (plane s's codes) as unsigned bytes, and an
unsigned-by-signed DP4A of it with activation word 8s + j of row m is 4^s times that plane's
dot, exactly. So for every row m
    dot_mg = sum_s (sum_j dp4a_u8s8(w_j & P_s, a_m[8s + j])) >> 2s  -  t_mg
equals int_gemv's sum (c-1)*q. A program loads BN weight rows x GC groups once and multiplies
them with BM activation rows: one AND per plane word, then one DP4A per plane word and row. The
weight bytes, not the M activation rows, are what a decode step streams.

FP32 order (per output row m, as gemv's per row): split s covers groups [s*per, (s+1)*per);
in it lane c folds groups s*per + c, + c + GC, ... ascending (common.scale_accumulate); the GC
lanes are summed pairwise ((l0+l1)+(l2+l3))+...; with SPLIT > 1 the last program of a row tile
to arrive sums the split partials ((p0+p1)+p2)+... in the kernel (counters zeroed by this
call's quantize kernel, partials from kernels.splitk per call: nothing shared between calls,
streams or graphs). Rows do not interact: a row's bits depend on M only through the config.

On CUDA a group's 8 code words are split into 8 [BN, GC] tensors so that each plane's dot is
one DP4A accumulator chain over the words (a [.., 8] tensor summed with tl.sum cost 1.7-2.4x
the instructions per weight byte in the sm_90 code); activation words are loaded per word as
[BM, GC] and broadcast over the BN rows. The interpreter computes the same integers with one
[BM, BN, GC, 8] DP4A per plane and a sum over the words (its cost is per operation); the GPU's
golden capture and check bind the chain to them.

Configs: the interpreter's are wide and few (it pays per program); the GPU's come from static
instruction counts of the sm_90 code (tools/sass_count.py), with K split until the grid has two
waves on 132 SMs. Not yet timed (no device time was left when this path was written): the
registry keeps the path out of the tuned selection until the bench has measured it.
"""
import functools

import torch
import triton
import triton.language as tl

from . import common, prepare, splitk
from .gemv import _chunk
from pq2verify import tiles, validate


@triton.jit
def _dp(wj, p, ab, word, mg, acc, INTERP: tl.constexpr):
    """acc + dp4a_u8s8(wj & p, activation word `word` of each row): [BM, BN, GC]."""
    a = tl.load(ab + word, mask=mg, other=0)                                 # [BM, GC]
    return common.dp4a((wj & p)[None, :, :], a[:, None, :], acc, INTERP, True)


@triton.jit
def _rows_kernel(a_ptr, a_sm, xs_ptr, t_ptr, g_sm, codes_ptr, scales_ptr, out_ptr, out_sm, out_sn,
                 part_ptr, count_ptr, dots_ptr, d_sm, d_sn, d_sg,
                 M, N, G, code_row, code_group, code_off, scale_row, scale_group, scale_off, per,
                 BM: tl.constexpr, BN: tl.constexpr, GC: tl.constexpr, LOG_GC: tl.constexpr,
                 CHUNKS: tl.constexpr, SPLIT: tl.constexpr, MASKED: tl.constexpr,
                 PREPARED: tl.constexpr, WRITE_DOTS: tl.constexpr, CHAIN: tl.constexpr,
                 INTERP: tl.constexpr):
    tile = tl.program_id(0)
    pid_k = tl.program_id(1)
    rn = tile * BN + tl.arange(0, BN)
    n_ok = rn < N
    rm = tl.arange(0, BM)
    m_ok = rm < M
    gi = tl.arange(0, GC)
    g_begin = pid_k * per
    g_end = tl.minimum(g_begin + per, G)
    lanes = tl.zeros([BM, BN, GC], dtype=tl.float32)
    plane0 = tl.full([], 0x03030303, tl.int32)   # shifted in int32: 0xC0C0C0C0 wraps
    for i in range(0, CHUNKS):   # constexpr trip count (Triton 3.6's interpreter under numpy 2)
        g0 = g_begin + i * GC
        g = g0 + gi
        g_ok = g < g_end
        w, ws = _chunk(codes_ptr, scales_ptr, rn, n_ok, g0, g_end, G, code_row, code_group,
                       code_off, scale_row, scale_group, scale_off, GC, PREPARED, MASKED)
        mg = m_ok[:, None] & g_ok[None, :]                                     # [BM, GC]
        if not CHAIN:
            # the interpreter pays per operation: one [BM, BN, GC, 8] DP4A per plane and a sum
            # over the words (the same integers as the chain below, a third of its time)
            w8 = tl.reshape(w, (BN, GC, 8))
            j = tl.arange(0, 8)
            dot = tl.zeros([BM, BN, GC], dtype=tl.int32)
            for s in tl.static_range(4):
                ap = a_ptr + rm[:, None, None] * a_sm + g[None, :, None] * 32 + s * 8 + j[None, None, :]
                a = tl.load(ap, mask=mg[:, :, None], other=0)
                acc = common.dp4a((w8 & (plane0 << (2 * s)))[None, :, :, :], a[:, None, :, :],
                                  tl.zeros([BM, BN, GC, 8], dtype=tl.int32), INTERP, True)
                dot += tl.sum(acc, axis=3) >> (2 * s)
        else:
            # the 8 words of each group as 8 [BN, GC] tensors (a thread's words stay its own), so a
            # plane's dot is one DP4A accumulator chain: no reduction across words
            w4 = tl.reshape(w, (BN, GC, 2, 2, 2))
            w03, w47 = tl.split(tl.permute(w4, (0, 1, 3, 4, 2)))
            w01, w23 = tl.split(tl.permute(w03, (0, 1, 3, 2)))
            w45, w67 = tl.split(tl.permute(w47, (0, 1, 3, 2)))
            w0, w1 = tl.split(w01)
            w2, w3 = tl.split(w23)
            w4_, w5 = tl.split(w45)
            w6, w7 = tl.split(w67)
            ab = a_ptr + rm[:, None] * a_sm + g[None, :] * 32
            dot = tl.zeros([BM, BN, GC], dtype=tl.int32)
            for s in tl.static_range(4):
                p = plane0 << (2 * s)
                acc = tl.zeros([BM, BN, GC], dtype=tl.int32)
                acc = _dp(w0, p, ab, 8 * s + 0, mg, acc, INTERP)
                acc = _dp(w1, p, ab, 8 * s + 1, mg, acc, INTERP)
                acc = _dp(w2, p, ab, 8 * s + 2, mg, acc, INTERP)
                acc = _dp(w3, p, ab, 8 * s + 3, mg, acc, INTERP)
                acc = _dp(w4_, p, ab, 8 * s + 4, mg, acc, INTERP)
                acc = _dp(w5, p, ab, 8 * s + 5, mg, acc, INTERP)
                acc = _dp(w6, p, ab, 8 * s + 6, mg, acc, INTERP)
                acc = _dp(w7, p, ab, 8 * s + 7, mg, acc, INTERP)
                dot += acc >> (2 * s)
        t = tl.load(t_ptr + rm[:, None] * g_sm + g[None, :], mask=mg, other=0)
        xs = tl.load(xs_ptr + rm[:, None] * g_sm + g[None, :], mask=mg, other=0.0)
        dot = dot - t[:, None, :]
        lanes = common.scale_accumulate(lanes, dot, xs[:, None, :], ws.to(tl.float32)[None, :, :])
        if WRITE_DOTS:
            dp = dots_ptr + rm[:, None, None] * d_sm + rn[None, :, None] * d_sn + g[None, None, :] * d_sg
            tl.store(dp, dot, mask=m_ok[:, None, None] & n_ok[None, :, None] & g_ok[None, None, :])
    y = tl.reshape(common.lane_tree(tl.reshape(lanes, (BM * BN, GC)), BM * BN, GC, LOG_GC), (BM, BN))
    ok = m_ok[:, None] & n_ok[None, :]
    op = out_ptr + rm[:, None] * out_sm + rn[None, :] * out_sn
    if SPLIT == 1:
        tl.store(op, prepare.to_out(y, out_ptr.dtype.element_ty, INTERP), mask=ok)
    else:
        # the last program of the tile to arrive sums the partials [SPLIT, M, N] in split order
        pp = part_ptr + rm[:, None] * N + rn[None, :]
        tl.store(pp + pid_k * M * N, y, mask=ok)
        tl.debug_barrier()   # the whole program's partial stores before the release below
        arrived = tl.atomic_add(count_ptr + tile, 1, sem="acq_rel", scope="gpu")
        if arrived == SPLIT - 1:
            tl.debug_barrier()
            acc = tl.load(pp, mask=ok, other=0.0, cache_modifier=".cg")
            for s in tl.static_range(1, SPLIT):
                acc = acc + tl.load(pp + s * M * N, mask=ok, other=0.0, cache_modifier=".cg")
            tl.store(op, prepare.to_out(acc, out_ptr.dtype.element_ty, INTERP), mask=ok)
            tl.store(count_ptr + tile, 0)   # left as found


# The DP4A chain on CUDA, the word-sum form under the interpreter (the same integers; a test runs
# the chain under the interpreter too, by setting this)
CHAIN = not common.INTERPRET

FIELDS = {"BM": tiles.pow2(2, 16), "BN": tiles.pow2(1), "GC": tiles.pow2(1),
          "groups_per_split": tiles.integer(1), "SPLIT": tiles.integer(1), "num_warps": tiles.WARPS}


def config(n: int, k: int, m: int = 2, interpret: bool | None = None) -> dict:
    """{BM, BN, GC, groups_per_split, SPLIT, num_warps} from shapes only (interpret: the
    interpreter's config or the GPU's; default this process's)."""
    interpret = common.INTERPRET if interpret is None else bool(interpret)
    # the interpreter's cost is per program, not per row: one BM = 16 tile serves every M
    return dict(_config(n, k, 16 if interpret else max(2, triton.next_power_of_2(m)), interpret))


def configs(interpret: bool) -> list[dict]:
    """Every distinct config config() picks for the interpreter or the GPU (pq2verify.tiles)."""
    return tiles.sweep("gemv_rows", lambda n, k, m: config(n, k, m, interpret))


@functools.lru_cache(maxsize=None)
def _config(n: int, k: int, bm: int, interpret: bool) -> tuple:
    groups = k // 128
    if interpret:
        # few wide programs; GC = 2 and two splits keep several chunks, a masked tail and the
        # in-kernel split reduction in small cases
        bn, gc, split, warps = min(64, max(8, triton.next_power_of_2(n))), 2, 2 if groups >= 4 else 1, 4
    else:
        # From sm_90 machine code compiled here (tools/sass_count.py; not yet timed): BN = 64,
        # GC = 8, 4 warps gives the fewest loop instructions per weight byte at every BM (5.7 at
        # M = 2, 8.9 at 4, 16.7 at 8, 26.6 at 16; gemv at M = 1: 10.9); smaller tiles cost more
        warps, bn = 4, 64
        gc = min(8, triton.next_power_of_2(groups))
        row_tiles = triton.cdiv(n, bn)
        split = 1
        while row_tiles * split < 264 and groups // (split * 2) >= gc:
            split *= 2
    per = triton.cdiv(groups, split)
    return (("BM", bm), ("BN", bn), ("GC", gc), ("groups_per_split", per),
            ("SPLIT", triton.cdiv(groups, per)), ("num_warps", warps))


def _resolve(n, k, m, interpret, cfg) -> dict:
    c = tiles.force("gemv_rows", config(n, k, m, interpret), cfg, FIELDS)
    if cfg is not None:
        tiles.splits("gemv_rows", k // 128, c["groups_per_split"], c["SPLIT"])
        if c["BM"] < m:
            raise ValueError(f"gemv_rows: config field BM={c['BM']}: below M={m}")
    return c


def fold(n: int, k: int, m: int = 2, interpret: bool | None = None, config: dict | None = None) -> dict:
    """Per output row, gemv's order: split s covers groups [s*per, min((s+1)*per, G)); lane c
    folds groups s*per + c, + c + GC, ... ascending; lanes pairwise; splits in order."""
    c = _resolve(n, k, m, interpret, config)
    return dict(lanes=c["GC"], groups_per_split=c["groups_per_split"], splits=c["SPLIT"])


def run(x, w, *, out=None, dots=None, check=True, config=None):
    out = validate.kernel_out("gemv_rows", x, w, out, dots, check)
    (m, k), n = x.shape, out.shape[1]
    if m == 0:
        return out
    cfg = _resolve(n, k, m, None, config)
    bm, bn, gc, split, per = cfg["BM"], cfg["BN"], cfg["GC"], cfg["SPLIT"], cfg["groups_per_split"]
    tiles_n = triton.cdiv(n, bn)
    count = torch.empty(tiles_n, dtype=torch.int32, device=x.device) if split > 1 else None
    q, xs, t = prepare.quantize_q8(x, order="plane", zero=count)
    part = splitk.partials(out.device, split * m * n) if split > 1 else out
    g = w.groups
    st = w.strides
    prepared = w.layout == "prepared"
    ds = dots.stride() if dots is not None else (0, 0, 0)
    _rows_kernel[(tiles_n, split)](
        q.view(torch.int32), k // 4, xs, t, g, w.codes_i32 if prepared else w.codes_u8, w.scales_f16,
        out, out.stride(0), out.stride(1), part, count if split > 1 else t,
        dots if dots is not None else out, ds[0], ds[1], ds[2],
        m, n, g, st["code_row"], st["code_group"], st["code_off"],
        st["scale_row"], st["scale_group"], st["scale_off"], per,
        BM=bm, BN=bn, GC=gc, LOG_GC=gc.bit_length() - 1, CHUNKS=triton.cdiv(per, gc), SPLIT=split,
        MASKED=not (prepared and n % bn == 0 and per % gc == 0 and g % per == 0),
        PREPARED=prepared, WRITE_DOTS=dots is not None, CHAIN=CHAIN, INTERP=common.INTERPRET,
        num_warps=cfg["num_warps"], num_stages=1)
    return out
