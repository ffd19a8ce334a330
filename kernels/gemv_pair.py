"""gemv_pair: M = 2, gemv's masked-plane DP4A with each weight word loaded once and used for
both tokens.

Arithmetic: gemv's (kernels/gemv.py): plane-order Q8 activations with group sums; code word j
of a group masked with P_s = 0x03030303 << 2s, DP4A'd unsigned-by-signed with activation word
8s + j of each token, shifted down by 2s, summed over the planes, minus the group sum t_g.

FP32 order: gemv's, per token: GC lanes a row, lane c folds groups c, c+GC, ... ascending
(common.scale_accumulate), lanes summed by the pairwise tree, splits summed in split order by
the tile's last program. So under the same fold fields (GC, groups_per_split, SPLIT) each row of
the output has the bits gemv gives for that row alone (tests/test_gemv_pair.py checks this); the
chooser takes gemv's splits and its own tiles.

Why two tokens and no more: the same kernel for 2-4 tokens (source at 1bd4f58) timed against
small_mma on the chained step was faster at M = 2 only; each token adds four DP4As per code
word, and at 3-4 tokens the instruction count outweighs the shared weight reads
(results/2026-12-07-decode-gemv-pair-h100/).

Launch (CUDA): PDL as gemv: the first DEPTH chunks' weight codes and scales are loaded before
griddepcontrol.wait; activations and every write come after it. The quantize kernel zeroes the
split-K counters. Under TRITON_INTERPRET=1 the PDL constexpr is False.
"""
import functools

import torch
import triton
import triton.language as tl

from . import common, gemv, prepare, splitk
from kernels import config as protocol, validate


@triton.jit
def _token_acts(a_ptr, a_sm, xs_ptr, xs_sm, t_ptr, t_sm, t: tl.constexpr, g, g_ok, j, MASKED: tl.constexpr):
    """Token t's activation words of the four planes [GC, 8] each, its group sums and scales [GC]."""
    a = a_ptr + t * a_sm + g[:, None] * 32 + j[None, :]
    if MASKED:
        m2 = g_ok[:, None]
        return (tl.load(a, mask=m2, other=0), tl.load(a + 8, mask=m2, other=0), tl.load(a + 16, mask=m2, other=0),
                tl.load(a + 24, mask=m2, other=0), tl.load(t_ptr + t * t_sm + g, mask=g_ok, other=0),
                tl.load(xs_ptr + t * xs_sm + g, mask=g_ok, other=0.0))
    return (tl.load(a), tl.load(a + 8), tl.load(a + 16), tl.load(a + 24), tl.load(t_ptr + t * t_sm + g),
            tl.load(xs_ptr + t * xs_sm + g))


@triton.jit
def _token_fold(lanes, w, acts, ws, plane0, BN: tl.constexpr, GC: tl.constexpr, INTERP: tl.constexpr):
    """One token's chunk: its group dots [BN, GC] (gemv's planes, minus t) folded into its lanes."""
    a0, a1, a2, a3, tg, xs = acts
    dot = gemv._plane_dot(w, a0, plane0, 0, BN, GC, INTERP)
    dot += gemv._plane_dot(w, a1, plane0, 1, BN, GC, INTERP)
    dot += gemv._plane_dot(w, a2, plane0, 2, BN, GC, INTERP)
    dot += gemv._plane_dot(w, a3, plane0, 3, BN, GC, INTERP)
    dot = dot - tg[None, :]
    return common.scale_accumulate(lanes, dot, xs[None, :], ws), dot


@triton.jit
def _token_out(lanes, t: tl.constexpr, rn, n_ok, N, out_ptr, out_sm, out_sn, part_ptr, pid_k,
               BN: tl.constexpr, GC: tl.constexpr, LOG_GC: tl.constexpr, SPLIT: tl.constexpr, INTERP: tl.constexpr):
    """Token t's row sums: to out (one split) or to this split's partial."""
    y = common.lane_tree(lanes, BN, GC, LOG_GC)
    if SPLIT == 1:
        tl.store(out_ptr + t * out_sm + rn * out_sn, prepare.to_out(y, out_ptr.dtype.element_ty, INTERP), mask=n_ok)
    else:
        tl.store(part_ptr + (pid_k * 2 + t) * N + rn, y, mask=n_ok)


@triton.jit
def _pair_kernel(a_ptr, a_sm, xs_ptr, xs_sm, t_ptr, t_sm, codes_ptr, scales_ptr, out_ptr, out_sm, out_sn,
                 part_ptr, count_ptr, dots_ptr, d_sm, d_sn, d_sg,
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
    # constants before the wait (PDL): the first DEPTH chunks' codes and scales
    w1, s1 = gemv._chunk(codes_ptr, scales_ptr, rn, n_ok, g_begin, 0, g_end, G, code_row, code_group,
                         code_off, scale_row, scale_group, scale_off, GC, CHUNKS, PREPARED, MASKED)
    if DEPTH >= 2:
        w2, s2 = gemv._chunk(codes_ptr, scales_ptr, rn, n_ok, g_begin, 1, g_end, G, code_row, code_group,
                             code_off, scale_row, scale_group, scale_off, GC, CHUNKS, PREPARED, MASKED)
    if PDL:
        tl.extra.cuda.gdc_wait()
    lanes0 = tl.zeros([BN, GC], dtype=tl.float32)
    lanes1 = tl.zeros([BN, GC], dtype=tl.float32)
    plane0 = tl.full([], 0x03030303, tl.int32)   # shifted in int32: 0xC0C0C0C0 wraps
    for i in range(0, CHUNKS):
        g = g_begin + i * GC + gi
        g_ok = g < g_end
        if PREPARED:
            # this chunk's activations before the look-ahead's weights (gemv's ACT_FIRST); the raw
            # layout's byte loads take more registers, and it spilled so (the sm_90 compile)
            acts0 = _token_acts(a_ptr, a_sm, xs_ptr, xs_sm, t_ptr, t_sm, 0, g, g_ok, j, MASKED)
            acts1 = _token_acts(a_ptr, a_sm, xs_ptr, xs_sm, t_ptr, t_sm, 1, g, g_ok, j, MASKED)
        w = tl.reshape(w1, (BN, GC, 8))
        ws = s1.to(tl.float32)
        if DEPTH == 1:
            w1, s1 = gemv._chunk(codes_ptr, scales_ptr, rn, n_ok, g_begin, i + 1, g_end, G, code_row, code_group,
                                 code_off, scale_row, scale_group, scale_off, GC, CHUNKS, PREPARED, MASKED)
        if DEPTH == 2:
            w1, s1 = w2, s2
            w2, s2 = gemv._chunk(codes_ptr, scales_ptr, rn, n_ok, g_begin, i + 2, g_end, G, code_row, code_group,
                                 code_off, scale_row, scale_group, scale_off, GC, CHUNKS, PREPARED, MASKED)
        if not PREPARED:
            acts0 = _token_acts(a_ptr, a_sm, xs_ptr, xs_sm, t_ptr, t_sm, 0, g, g_ok, j, MASKED)
            acts1 = _token_acts(a_ptr, a_sm, xs_ptr, xs_sm, t_ptr, t_sm, 1, g, g_ok, j, MASKED)
        lanes0, dot0 = _token_fold(lanes0, w, acts0, ws, plane0, BN, GC, INTERP)
        lanes1, dot1 = _token_fold(lanes1, w, acts1, ws, plane0, BN, GC, INTERP)
        if WRITE_DOTS:
            dm = n_ok[:, None] & g_ok[None, :]
            dp = dots_ptr + rn[:, None] * d_sn + g[None, :] * d_sg
            tl.store(dp, dot0, mask=dm)
            tl.store(dp + d_sm, dot1, mask=dm)
    _token_out(lanes0, 0, rn, n_ok, N, out_ptr, out_sm, out_sn, part_ptr, pid_k, BN, GC, LOG_GC, SPLIT, INTERP)
    _token_out(lanes1, 1, rn, n_ok, N, out_ptr, out_sm, out_sn, part_ptr, pid_k, BN, GC, LOG_GC, SPLIT, INTERP)
    if SPLIT > 1:
        # partials [SPLIT, 2, N]; the tile's last program sums both tokens' in split order
        tok = tl.arange(0, 2)
        ok = (tok[:, None] < 2) & n_ok[None, :]
        splitk.sum_if_last(part_ptr, count_ptr, tile, tok[:, None] * N + rn[None, :], ok, 2 * N, out_ptr,
                           tok[:, None] * out_sm + rn[None, :] * out_sn, SPLIT, INTERP)


FIELDS = {"BN": protocol.pow2(1), "GC": protocol.pow2(1), "groups_per_split": protocol.integer(1),
          "SPLIT": protocol.integer(1), "DEPTH": protocol.integer(1, 2), "PDL": protocol.flag,
          "num_warps": protocol.WARPS}


def config(n: int, k: int, m: int = 2, interpret: bool | None = None) -> dict:
    """{BN, GC, groups_per_split, SPLIT, DEPTH, PDL, num_warps}. interpret: the interpreter's
    config or the GPU's (default: this process's)."""
    return dict(_config(n, k, common.INTERPRET if interpret is None else bool(interpret)))


def configs(interpret: bool) -> list[dict]:
    """Every distinct config config() picks for the interpreter or the GPU (kernels.config)."""
    return protocol.sweep("gemv_pair", lambda n, k, m: config(n, k, m, interpret))


@functools.lru_cache(maxsize=None)
def _config(n: int, k: int, interpret: bool) -> tuple:
    # gemv's splits; on the GPU 32-row tiles of at most 8 groups on 4 warps (128 registers, four
    # programs an SM in the sm_90 compile): measured on an H100 against 8 warps and 16-row tiles,
    # and gemv's 64-row, 16-group tiles took 226-254 registers with two tokens
    # (results/2026-12-07-decode-gemv-pair-h100/)
    c = gemv.config(n, k, 1, interpret)
    bn, gc, warps = (c["BN"], c["GC"], c["num_warps"]) if interpret else (32, min(8, c["GC"]), 4)
    return (("BN", bn), ("GC", gc), ("groups_per_split", c["groups_per_split"]), ("SPLIT", c["SPLIT"]),
            ("DEPTH", min(2, c["DEPTH"])), ("PDL", c["PDL"]), ("num_warps", warps))


def _resolve(n, k, interpret, cfg) -> dict:
    c = protocol.force("gemv_pair", config(n, k, 2, interpret), cfg, FIELDS)
    if cfg is not None:
        protocol.splits("gemv_pair", k // 128, c["groups_per_split"], c["SPLIT"])
    return c


def fold(n: int, k: int, m: int = 2, interpret: bool | None = None, config: dict | None = None) -> dict:
    """gemv's FP32 order, per token: split s covers groups [s*per, min((s+1)*per, G)); lane c
    folds groups s*per + c, + c + GC, ... ascending; lanes summed pairwise; splits summed
    ((p0+p1)+p2)+... by the last program of the tile."""
    c = _resolve(n, k, interpret, config)
    return dict(lanes=c["GC"], groups_per_split=c["groups_per_split"], splits=c["SPLIT"])


def run(x, w, *, out=None, dots=None, check=True, config=None):
    out = validate.kernel_out(__name__, x, w, out, dots, check)
    (m, k), n = x.shape, out.shape[1]
    if m == 0:
        return out
    if m != 2:     # a caller that skipped the table's check (check=False)
        raise ValueError(f"gemv_pair: M={m}: the kernel computes exactly two rows")
    cfg = _resolve(n, k, None, config)
    split, bn, gc, per = cfg["SPLIT"], cfg["BN"], cfg["GC"], cfg["groups_per_split"]
    row_tiles = triton.cdiv(n, bn)
    pdl = cfg["PDL"] and not common.INTERPRET and x.device.type == "cuda"
    count = torch.empty(row_tiles, dtype=torch.int32, device=x.device) if split > 1 else None
    q, xs, t = prepare.quantize_q8(x, order="plane", pdl=pdl, zero=count)
    g = w.groups
    part = splitk.partials(x.device, split * 2 * n) if split > 1 else out
    st = w.strides
    prepared = w.layout == "prepared"
    write_dots = dots is not None
    dd = dots if write_dots else out
    ds = dots.stride() if write_dots else (0, 0, 0)
    _pair_kernel[(row_tiles, split)](
        q.view(torch.int32), q.stride(0) // 4, xs, xs.stride(0), t, t.stride(0),
        w.codes_i32 if prepared else w.codes_u8, w.scales_f16, out, out.stride(0), out.stride(1),
        part, count if split > 1 else t, dd, ds[0], ds[1], ds[2],
        n, g, st["code_row"], st["code_group"], st["code_off"],
        st["scale_row"], st["scale_group"], st["scale_off"], per,
        BN=bn, GC=gc, LOG_GC=gc.bit_length() - 1, CHUNKS=triton.cdiv(per, gc),
        DEPTH=cfg["DEPTH"], SPLIT=split,
        MASKED=not (prepared and n % bn == 0 and per % gc == 0 and g % per == 0),
        PREPARED=prepared, WRITE_DOTS=write_dots, PDL=pdl, INTERP=common.INTERPRET,
        num_warps=cfg["num_warps"], num_stages=1, launch_pdl=pdl)
    return out
