"""single: the tuned M = 1 path, a pure GEMV with DP4A on raw codes.

Arithmetic: plane-order Q8 activations with group sums (kernels.prepare.quantize_q8). In a
prepared int32 code word w (bytes 4j..4j+3 of a group), plane s = (w >> 2s) & 0x03030303 holds
the raw codes {0,1,2} of elements 4(4j+i)+s, which plane order stores at s*32 + 4j + i: the
activation int32 word 8s + j of the group. So
    dot_g = sum_{s<4, j<8} dp4a(plane_s(w_j), a_word[8s + j]) - t_g
equals int_gemv's sum (c-1)*q exactly (the unsigned-codes trick, SPEC §4).

FP32 order (differs from int_gemv; documented, fixed per config): a program owns BN rows and a
contiguous range of groups, walked in chunks of GC groups. Lane c (c < GC) of each row keeps
its own partial, lane_c = lane_c + dot_g*xs_g*ws_g (common.scale_accumulate) for
g = g0+c, g0+c+GC, ... ascending (g0 the split's first group); the GC lanes are then summed
by an explicit pairwise tree ((l0+l1)+(l2+l3))+... (not tl.sum, whose order would follow the
register layout). With SPLIT > 1 the split partials go to per-call partials [SPLIT, 1, N] and are
summed in ascending split order, ((p0 + p1) + p2) + ..., by splitk.reduce_splits.
`fold(n, k, m)` reports GC, groups per split and SPLIT for a shape (or a forced config). The GPU and the interpreter use
different configs (and the GPU may contract acc + a*b into an FMA), so their bits may differ.

Prepared weights are the fast path (int32 word loads, 16-byte aligned rows); raw weights
assemble each word from four byte loads (slower, same values).
"""
import functools

import torch
import triton
import triton.language as tl

from . import common, prepare, splitk
from kernels import config as protocol, validate


@triton.jit
def _code_words(codes_ptr, rn, g, m3, G, code_row, code_group, code_off, PREPARED: tl.constexpr):
    """int32 code words [BN, GC, 8] of rows rn and groups g (word j = code bytes 4j..4j+3)."""
    j = tl.arange(0, 8)
    if PREPARED:
        # row stride G*8 words keeps rows 32-byte aligned: 16-byte vector loads
        wp = codes_ptr + (rn[:, None, None] * G + g[None, :, None]) * 8 + j[None, None, :]
        w = tl.load(wp, mask=m3, other=0)
    else:
        # raw blocks are 34 bytes (words unaligned): assemble each word from its four bytes
        bp = (codes_ptr + code_off + rn[:, None, None] * code_row
              + g[None, :, None] * code_group + 4 * j[None, None, :])
        w = tl.load(bp, mask=m3, other=0).to(tl.int32)
        w = w | (tl.load(bp + 1, mask=m3, other=0).to(tl.int32) << 8)
        w = w | (tl.load(bp + 2, mask=m3, other=0).to(tl.int32) << 16)
        w = w | (tl.load(bp + 3, mask=m3, other=0).to(tl.int32) << 24)
    return w


@triton.jit
def _single_kernel(a_ptr, xs_ptr, t_ptr, codes_ptr, scales_ptr, out_ptr, out_sn, part_ptr,
                   dots_ptr, d_sn, d_sg,
                   N, G, code_row, code_group, code_off,
                   scale_row, scale_group, scale_off, groups_per_split,
                   BN: tl.constexpr, GC: tl.constexpr, LOG_GC: tl.constexpr, CHUNKS: tl.constexpr,
                   SPLIT: tl.constexpr, PREFETCH: tl.constexpr,
                   PREPARED: tl.constexpr, WRITE_DOTS: tl.constexpr, INTERP: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rn = pid_n * BN + tl.arange(0, BN)
    n_ok = rn < N
    gi = tl.arange(0, GC)
    j = tl.arange(0, 8)
    g_begin = pid_k * groups_per_split
    g_end = tl.minimum(g_begin + groups_per_split, G)
    lanes = tl.zeros([BN, GC], dtype=tl.float32)
    if PREFETCH:
        # register double buffer: chunk i+1's words are in flight while chunk i is computed
        g = g_begin + gi
        m3 = (n_ok[:, None] & (g < g_end)[None, :])[:, :, None] & (j < 8)[None, None, :]
        w_next = _code_words(codes_ptr, rn, g, m3, G, code_row, code_group, code_off, PREPARED)
    # constexpr trip count: runtime loop bounds break Triton 3.6's interpreter under numpy >= 2.4
    for i in range(0, CHUNKS):
        g = g_begin + i * GC + gi
        g_ok = g < g_end
        m2 = n_ok[:, None] & g_ok[None, :]
        if PREFETCH:
            w = w_next
            gn = g + GC
            m3n = (n_ok[:, None] & (gn < g_end)[None, :])[:, :, None] & (j < 8)[None, None, :]
            w_next = _code_words(codes_ptr, rn, gn, m3n, G, code_row, code_group, code_off, PREPARED)
        else:
            m3 = m2[:, :, None] & (j < 8)[None, None, :]
            w = _code_words(codes_ptr, rn, g, m3, G, code_row, code_group, code_off, PREPARED)
        acc = tl.zeros([BN, GC, 8], dtype=tl.int32)
        for s in tl.static_range(4):
            a = tl.load(a_ptr + g[:, None] * 32 + s * 8 + j[None, :],
                        mask=g_ok[:, None], other=0)                     # [GC, 8] activation words
            a = tl.broadcast_to(a[None, :, :], [BN, GC, 8])
            acc = common.dp4a((w >> (2 * s)) & 0x03030303, a, acc, INTERP)
        t = tl.load(t_ptr + g, mask=g_ok, other=0)
        dot = tl.sum(acc, axis=2) - t[None, :]
        xs = tl.load(xs_ptr + g, mask=g_ok, other=0.0)
        ws = tl.load(scales_ptr + scale_off + rn[:, None] * scale_row + g[None, :] * scale_group,
                     mask=m2, other=0.0).to(tl.float32)
        lanes = common.scale_accumulate(lanes, dot, xs[None, :], ws)
        if WRITE_DOTS:
            tl.store(dots_ptr + rn[:, None] * d_sn + g[None, :] * d_sg, dot, mask=m2)
    y = common.lane_tree(lanes, BN, GC, LOG_GC)
    if SPLIT == 1:
        tl.store(out_ptr + rn * out_sn, prepare.to_out(y, out_ptr.dtype.element_ty, INTERP), mask=n_ok)
    else:
        tl.store(part_ptr + pid_k * N + rn, y, mask=n_ok)


# A forced config (run/fold config=) is checked field by field (kernels.config), and its
# splits must cover the groups with none empty.
FIELDS = {"BN": protocol.pow2(1), "GC": protocol.pow2(1), "groups_per_split": protocol.integer(1),
          "SPLIT": protocol.integer(1), "PREFETCH": protocol.flag, "num_warps": protocol.WARPS, "num_stages": protocol.STAGES}


def config(n: int, k: int, m: int, interpret: bool | None = None) -> dict:
    """{BN, GC, groups_per_split, SPLIT, PREFETCH, num_warps, num_stages} from shapes only.
    Memory-bound: a chunk of BN rows x GC groups is BN*GC*32 bytes of 16-byte word loads;
    split-K over groups when the row tiles alone give too few programs to keep every SM's
    loads in flight. interpret: the interpreter's config or the GPU's (default: this process's)."""
    return dict(_config(n, k, common.INTERPRET if interpret is None else bool(interpret)))


@functools.lru_cache(maxsize=None)
def _config(n: int, k: int, interpret: bool):
    groups = k // 128
    if interpret:
        # the interpreter pays per program: wide tiles; GC = 2 and two splits still exercise
        # several chunks, a masked tail and the split reduction
        per, split = splitk.split_groups(groups, 2)
        return dict(BN=min(128, max(8, triton.next_power_of_2(n))), GC=2, groups_per_split=per, SPLIT=split,
                    PREFETCH=True, num_warps=4, num_stages=1)
    # measured on the H200 (CUDA graphs, weights rotated past L2): 8 rows x 8 groups a chunk,
    # 4 warps; the register prefetch of the next chunk pays when all programs are resident
    # at once (<= ~2048) and walk few chunks, and costs occupancy otherwise
    gc = min(8, triton.next_power_of_2(groups))
    bn = 8
    tiles_n = triton.cdiv(n, bn)
    want = 1
    while tiles_n * want < 1024 and groups // (2 * want) >= 2 * gc:
        want *= 2
    per, split = splitk.split_groups(groups, want)
    prefetch = tiles_n * split <= 2048 and triton.cdiv(per, gc) <= 6
    return dict(BN=bn, GC=gc, groups_per_split=per, SPLIT=split, PREFETCH=prefetch, num_warps=4, num_stages=3)


def configs(interpret: bool) -> list[dict]:
    """Every distinct config config() picks for the interpreter or the GPU (kernels.config)."""
    return protocol.sweep("single", lambda n, k, m: config(n, k, m, interpret))


def _resolve(n, k, interpret, cfg) -> dict:
    c = protocol.force("single", _config(n, k, common.INTERPRET if interpret is None else bool(interpret)), cfg, FIELDS)
    if cfg is not None:
        protocol.splits("single", k // 128, c["groups_per_split"], c["SPLIT"])
    return c


def fold(n: int, k: int, m: int, interpret: bool | None = None, config: dict | None = None) -> dict:
    """The FP32 order a config gives (for emulation): split s covers groups
    [s*per, min((s+1)*per, G)); in it lane c folds groups s*per + c, + c + lanes, ... ascending;
    lanes are summed pairwise ((l0+l1)+(l2+l3))+...; splits are summed ((p0+p1)+p2)+..."""
    c = _resolve(n, k, interpret, config)
    return dict(lanes=c["GC"], groups_per_split=c["groups_per_split"], splits=c["SPLIT"])


def run(x, w, *, out=None, dots=None, check=True, config=None):
    out = validate.kernel_out(__name__, x, w, out, dots, check)
    (m, k), n = x.shape, out.shape[1]
    if m == 0:
        return out
    cfg = _resolve(n, k, None, config)
    q, xs, t = prepare.quantize_q8(x, order="plane")
    words = q[0].view(torch.int32)
    bn, gc, per, split = cfg["BN"], cfg["GC"], cfg["groups_per_split"], cfg["SPLIT"]
    st = w.strides
    prepared = w.layout == "prepared"
    part = splitk.partials(x.device, split * n) if split > 1 else out
    write_dots = dots is not None
    dd = dots if write_dots else out
    ds = dots.stride() if write_dots else (0, 0, 0)
    _single_kernel[(triton.cdiv(n, bn), split)](
        words, xs[0], t[0], w.codes_i32 if prepared else w.codes_u8, w.scales_f16,
        out, out.stride(1), part, dd, ds[1], ds[2],
        n, w.groups, st["code_row"], st["code_group"], st["code_off"],
        st["scale_row"], st["scale_group"], st["scale_off"], per,
        BN=bn, GC=gc, LOG_GC=gc.bit_length() - 1, CHUNKS=triton.cdiv(per, gc), SPLIT=split,
        PREFETCH=cfg["PREFETCH"], PREPARED=prepared, WRITE_DOTS=write_dots,
        INTERP=common.INTERPRET, num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    if split > 1:
        splitk.reduce_splits(part, out, split, m, n)
    return out
