"""small_mma: the tuned path for M = 2..16 (M = 1 works too).

Arithmetic: plane-order Q8 activations with group sums (kernels.prepare.quantize_q8). For a
group g, the code byte b of row n holds the codes of elements 4b+s (s = 0..3); plane s of the
weights, (byte >> 2s) & 3, is an int8 [32, BN] matrix of raw codes {0,1,2} whose row b lines up
with activation column s*32+b of the plane-order group. So
    dot_g[m, n] = sum_s tl.dot(q[m, 128g+32s : 128g+32s+32], plane_s) - t[m, g]
is exactly int_gemv's sum (c-1)*q (the unsigned-codes trick, SPEC §4).

Instructions per weight byte decide its speed (a decode call is issue-bound, not DRAM-bound):
on CUDA a plane is one 32-bit shift and AND per four code bytes (common.code_plane; Triton's
own byte ops took about three instructions a byte), and the MMA accumulator starts at -t[m, g]
so no per-element subtraction follows. On the H200 (results/2026-12-01-decode-small-mma-body/) the body alone gave the
old body's bits 1.3-2.2x faster per shape; with the split-K cap below, the chained M = 16
decode step went from 9.35 to 5.93 ms (the bench's 305 calls), 25% of the floor.

Launch (CUDA, PDL in the config): the quantize kernel and this one are launched with
programmatic dependent launch, as gemv is; this kernel waits for the quantize grid
(griddepcontrol.wait) before its first load.

FP32 order: a program owns one N tile and a contiguous range of groups (split-K over groups);
it folds acc = acc + dot_g*xs*ws (common.scale_accumulate) for g ascending from 0.0, and writes
its partial to per-call partials [SPLIT, M, N] (kernels.splitk). The last program of an N tile
to arrive (a per-call arrival counter, zeroed by this call's quantize kernel) sums the tile's
partials in the fixed order ((p0 + p1) + p2) + ... and casts to x's dtype: no reduce kernel,
and whichever program arrives last, the order and so the bits are the same. With SPLIT = 1 the
program writes the cast result directly (same value as the reduction).
"""
import functools

import torch
import triton
import triton.language as tl

from . import common, prepare, splitk
from kernels import config as protocol, validate

# --- the kernel --------------------------------------------------------------------------
@triton.jit
def codes(codes_ptr, rn, n_ok, g, live, G, code_row, code_group, code_off, SWAP: tl.constexpr,
           PREPARED: tl.constexpr, MASKED: tl.constexpr):
    """Code bytes of rows rn, group g: [BN, 32] when SWAP, else [32, BN]. With MASKED, rows past
    N and a dead group (live false) read as zero."""
    rb = tl.arange(0, 32)
    if PREPARED:
        # row stride G*32 bytes written so the compiler sees 32-byte aligned rows (16-byte loads)
        row = rn * (G * 32) + g * 32
    else:
        row = code_off + rn * code_row + g * code_group
    if SWAP:
        ptr = codes_ptr + row[:, None] + rb[None, :]
        ok = n_ok[:, None] & live
    else:
        ptr = codes_ptr + row[None, :] + rb[:, None]
        ok = n_ok[None, :] & live
    if MASKED:
        return tl.load(ptr, mask=ok, other=0)
    return tl.load(ptr)


@triton.jit
def plane_dots(c, seed, q_ptr, q_sm, rm, m_ok, g, live, SWAP: tl.constexpr, MASKED: tl.constexpr,
               INTERP: tl.constexpr):
    """seed + sum_s tl.dot(plane-order q[rm, 128g+32s : +32], (c >> 2s) & 3) for code bytes c of
    group g: int32 [BM, BN], or [BN, BM] when SWAP (the weight planes as the MMA's A operand,
    activations as B). Seeded with -t, it is the group dot minus the group sum with no
    subtraction per element."""
    rb = tl.arange(0, 32)
    d = seed
    for s in tl.static_range(4):
        if SWAP:
            ap = q_ptr + rm[None, :] * q_sm + (g * 128 + s * 32) + rb[:, None]     # [32, BM]
            ok = m_ok[None, :]
        else:
            ap = q_ptr + rm[:, None] * q_sm + (g * 128 + s * 32) + rb[None, :]     # [BM, 32]
            ok = m_ok[:, None]
        if MASKED:
            a = tl.load(ap, mask=ok & live, other=0)
        else:
            a = tl.load(ap, mask=ok, other=0)
        p = common.code_plane(c, s, INTERP)
        if SWAP:
            d = tl.dot(p, a, d, out_dtype=tl.int32)
        else:
            d = tl.dot(a, p, d, out_dtype=tl.int32)
    return d


@triton.jit
def _sums_scales(t_ptr, t_sm, xs_ptr, xs_sm, scales_ptr, scale_off, scale_row, scale_group,
                 m_off, n_off, mn, nn, g, ok):
    """Group g's sums t and activation scales xs (per row of x) and weight scales ws (per row of
    the weights, as fp32); zeros where not ok."""
    t = tl.load(t_ptr + m_off * t_sm + g, mask=mn & ok, other=0)
    xs = tl.load(xs_ptr + m_off * xs_sm + g, mask=mn & ok, other=0.0)
    ws = tl.load(scales_ptr + scale_off + n_off * scale_row + g * scale_group, mask=nn & ok, other=0.0)
    return t, xs, ws.to(tl.float32)


@triton.jit
def _small_mma_kernel(q_ptr, q_sm, xs_ptr, xs_sm, t_ptr, t_sm,
                      codes_ptr, scales_ptr, out_ptr, out_sm, out_sn, part_ptr, count_ptr,
                      dots_ptr, d_sm, d_sn, d_sg,
                      M, N, G, code_row, code_group, code_off,
                      scale_row, scale_group, scale_off,
                      BM: tl.constexpr, BN: tl.constexpr, PER: tl.constexpr, SPLIT: tl.constexpr,
                      SWAP: tl.constexpr, UNROLL: tl.constexpr,
                      PREPARED: tl.constexpr, MASKED: tl.constexpr, PDL: tl.constexpr,
                      WRITE_DOTS: tl.constexpr, INTERP: tl.constexpr):
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rm = tl.arange(0, BM)
    m_ok = rm < M
    rn = pid_n * BN + tl.arange(0, BN)
    n_ok = rn < N
    g_begin = pid_k * PER
    # SWAP keeps everything transposed ([BN, BM]); each element's FP32 sequence is the same
    if SWAP:
        acc = tl.zeros([BN, BM], dtype=tl.float32)
        mn = rm[None, :] < M
        nn = n_ok[:, None]
        m_off = rm[None, :]
        n_off = rn[:, None]
    else:
        acc = tl.zeros([BM, BN], dtype=tl.float32)
        mn = m_ok[:, None]
        nn = n_ok[None, :]
        m_off = rm[:, None]
        n_off = rn[None, :]
    if PDL:
        # launched with programmatic dependent launch after this call's quantize kernel, which
        # writes what this kernel reads; the pipeliner's first code loads come after this wait
        tl.extra.cuda.gdc_wait()
    # the group sums and scales are loaded a group ahead (tiny loads, but each would otherwise
    # stall its iteration on an L2 round trip; the pipeliner only stages the MMA operands)
    t_n, xs_n, ws_n = _sums_scales(t_ptr, t_sm, xs_ptr, xs_sm, scales_ptr, scale_off, scale_row, scale_group,
                                   m_off, n_off, mn, nn, g_begin, g_begin < G)
    # constexpr trip count: runtime loop bounds break Triton 3.6's interpreter under numpy >= 2.4;
    # only the last split can run past G (MASKED), and its extra groups leave acc untouched
    for i in range(0, PER // UNROLL):
        for u in tl.static_range(UNROLL):
            g = g_begin + i * UNROLL + u
            live = g < G
            t, xs, ws = t_n, xs_n, ws_n
            t_n, xs_n, ws_n = _sums_scales(t_ptr, t_sm, xs_ptr, xs_sm, scales_ptr, scale_off, scale_row,
                                           scale_group, m_off, n_off, mn, nn, g + 1,
                                           (i * UNROLL + u + 1 < PER) & (g + 1 < G))
            c = codes(codes_ptr, rn, n_ok, g, live, G, code_row, code_group, code_off, SWAP, PREPARED, MASKED)
            dot = plane_dots(c, tl.broadcast_to(-t, acc.shape), q_ptr, q_sm, rm, m_ok, g, live, SWAP, MASKED,
                             INTERP)
            if MASKED:
                acc = tl.where(live, common.scale_accumulate(acc, dot, xs, ws), acc)
            else:
                acc = common.scale_accumulate(acc, dot, xs, ws)
            if WRITE_DOTS:
                tl.store(dots_ptr + m_off * d_sm + n_off * d_sn + g * d_sg, dot, mask=mn & nn & live)
    if SPLIT == 1:
        tl.store(out_ptr + m_off * out_sm + n_off * out_sn,
                 prepare.to_out(acc, out_ptr.dtype.element_ty, INTERP), mask=mn & nn)
    else:
        tl.store(part_ptr + (pid_k * M + m_off) * N + n_off, acc, mask=mn & nn)
        splitk.sum_if_last(part_ptr, count_ptr, pid_n, m_off * N + n_off, mn & nn, M * N,
                           out_ptr, m_off * out_sm + n_off * out_sn, SPLIT, INTERP)


# A forced config (run/fold config=) is checked field by field (kernels.config); its splits
# must cover the groups with none empty, and groups per split be a multiple of UNROLL.
FIELDS = {"BN": protocol.pow2(16), "groups_per_split": protocol.integer(1), "SPLIT": protocol.integer(1),
          "SWAP": protocol.flag, "UNROLL": protocol.integer(1), "PDL": protocol.flag,
          "num_warps": protocol.WARPS, "num_stages": protocol.STAGES}


def config(n: int, k: int, m: int, interpret: bool | None = None) -> dict:
    """{BN, groups_per_split, SPLIT, SWAP, UNROLL, PDL, num_warps, num_stages} from shapes only
    (M bucketed to 8 or 16). PDL: launch the quantize kernel and this one with programmatic
    dependent launch (CUDA only). Decode is memory-bound: aim for ~1000+ programs so every SM has
    several tiles' loads in flight, but keep the partial traffic (SPLIT*M*N*8 bytes) small next
    to the N*K/4 weight bytes. Groups per split is a multiple of UNROLL (groups per loop trip).
    interpret: the interpreter's config or the GPU's (default: this process's)."""
    return dict(_config(m_bucket(m), n, k, common.INTERPRET if interpret is None else bool(interpret)))


@functools.lru_cache(maxsize=None)
def _config(m_bucket: int, n: int, k: int, interpret: bool):
    groups = k // 128
    if interpret:
        # the interpreter pays per program: wide tiles, but still two splits (and an unrolled
        # body with a dead tail group when G is odd) to exercise them
        per, split = splitk.split_groups(groups, 2, 2)
        return dict(BN=min(256, max(16, triton.next_power_of_2(n))), groups_per_split=per, SPLIT=split, SWAP=False,
                    UNROLL=2, PDL=False, num_warps=4, num_stages=1)
    bn, unroll = 128, 1
    tiles_n = triton.cdiv(n, bn)
    want = 1
    # ~1000 programs; but once there are two per SM, the partials at M = 16 (SPLIT*16*N*4 bytes
    # written, then read back) stay within ~40% of the N*K/4 weight bytes: on the H200, down
    # (K = 17408) took 20.9 us at M = 16 with 8 splits against 27.3 with 28 (results/2026-12-01-decode-small-mma-body/)
    while (tiles_n * want < 1024 and groups // (2 * want) >= 4
           and (tiles_n * want < 264 or 2 * want * 16 * 32 <= 0.4 * k)):
        want *= 2
    per, split = splitk.split_groups(groups, want, unroll)
    # a divisor of G close to that leaves no dead groups: the kernel's unmasked loads
    div = max(d for d in range(1, per + 1) if groups % d == 0)
    if 2 * div >= per:
        per, split = div, groups // div
    # UNROLL = 2 compiles to 13% fewer instructions a byte but ran slower on the H200 (gate_up
    # at M = 16: 36.7 us against 33.9; 98 registers against 91; results/2026-12-01-decode-small-mma-body/, run 8)
    return dict(BN=bn, groups_per_split=per, SPLIT=split, SWAP=False, UNROLL=unroll, PDL=True,
                num_warps=4, num_stages=3)


def m_bucket(m: int) -> int:
    return 16 if m > 8 else 8


def configs(interpret: bool) -> list[dict]:
    """Every distinct config config() picks for the interpreter or the GPU (kernels.config)."""
    return protocol.sweep("small_mma", lambda n, k, m: config(n, k, m, interpret))


def _resolve(n, k, m, interpret, cfg) -> dict:
    c = protocol.force("small_mma", _config(m_bucket(m), n, k, common.INTERPRET if interpret is None else bool(interpret)),
                    cfg, FIELDS)
    if cfg is not None:
        protocol.multiple("small_mma", "groups_per_split", c["groups_per_split"], "UNROLL", c["UNROLL"])
        protocol.splits("small_mma", k // 128, c["groups_per_split"], c["SPLIT"])
    return c


def fold(n: int, k: int, m: int, interpret: bool | None = None, config: dict | None = None) -> dict:
    """The FP32 order a config gives (for emulation): split s folds groups
    [s*per, min((s+1)*per, G)) ascending from 0.0; splits are summed ((p0+p1)+p2)+..."""
    c = _resolve(n, k, m, interpret, config)
    return dict(groups_per_split=c["groups_per_split"], lanes=1, splits=c["SPLIT"])


def run(x, w, *, out=None, dots=None, check=True, config=None):
    out = validate.kernel_out(__name__, x, w, out, dots, check)
    (m, k), n = x.shape, out.shape[1]
    if m == 0:
        return out
    cfg = _resolve(n, k, m, None, config)
    groups = w.groups
    bn, per, split = cfg["BN"], cfg["groups_per_split"], cfg["SPLIT"]
    tiles_n = triton.cdiv(n, bn)
    # split-K: per-call partials and arrival counters (never shared between calls or graphs);
    # the quantize kernel zeroes the counters before this call's kernel reads them
    count = torch.empty(tiles_n, dtype=torch.int32, device=x.device) if split > 1 else None
    pdl = cfg["PDL"] and not common.INTERPRET and x.device.type == "cuda"
    q, xs, t = prepare.quantize_q8(x, order="plane", pdl=pdl, zero=count)
    st = w.strides
    prepared = w.layout == "prepared"
    part = splitk.partials(x.device, split * m * n) if split > 1 else out
    write_dots = dots is not None
    dd = dots if write_dots else out
    ds = dots.stride() if write_dots else (0, 0, 0)
    _small_mma_kernel[(tiles_n, split)](
        q, q.stride(0), xs, xs.stride(0), t, t.stride(0),
        w.codes_u8, w.scales_f16, out, out.stride(0), out.stride(1), part, count if split > 1 else t,
        dd, ds[0], ds[1], ds[2],
        m, n, groups, st["code_row"], st["code_group"], st["code_off"],
        st["scale_row"], st["scale_group"], st["scale_off"],
        BM=16, BN=bn, PER=per, SPLIT=split, SWAP=cfg["SWAP"], UNROLL=cfg["UNROLL"],
        PREPARED=prepared, MASKED=not (prepared and n % bn == 0 and groups % per == 0), PDL=pdl,
        WRITE_DOTS=write_dots, INTERP=common.INTERPRET, num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
        launch_pdl=pdl)
    return out
