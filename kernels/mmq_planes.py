"""mmq_planes: the tuned prefill path (M > 16; any M works), claimed BIT-IDENTICAL to mmq.

Arithmetic: plane-order Q8 activations with group sums (kernels.prepare.quantize_q8). Per group
g, four int8 tensor-core dots with K = 32 on the raw code planes {0,1,2},
    dot_g = sum_s tl.dot(q[:, 128g+32s : +32], (codes >> 2s) & 3) - t[:, g],
give exactly mmq's integer group dot sum (c-1)*q (unsigned-codes trick, SPEC §4).

FP32 order: identical to mmq's for every output element: acc starts at 0.0 and each group is
folded with common.scale_accumulate(acc, dot_g, xs [BM,1] fp32, ws [1,BN] fp32) for g strictly
ascending over all groups (no split-K), then cast to x's dtype (prepare.to_out, as mmq). Tile
sizes do not enter the per-element sequence, so they may differ from mmq's. The SWAP config
(chosen for the large shapes) computes the transposed tile, weights as the MMA's A operand,
with xs [1,BM] / ws [BN,1]: the same per-element expression, bit-identical to mmq on the H200.
"""
import functools

import triton
import triton.language as tl

from . import common, prepare
from .small_mma import codes, plane_dots
from kernels import config as protocol, validate


@triton.jit
def _mmq_planes_kernel(q_ptr, q_sm, xs_ptr, xs_sm, t_ptr, t_sm,
                       codes_ptr, scales_ptr, out_ptr, out_sm, out_sn,
                       dots_ptr, d_sm, d_sn, d_sg,
                       M, N, code_row, code_group, code_off,
                       scale_row, scale_group, scale_off,
                       BM: tl.constexpr, BN: tl.constexpr, G: tl.constexpr, SWAP: tl.constexpr,
                       PREPARED: tl.constexpr, WRITE_DOTS: tl.constexpr, INTERP: tl.constexpr):
    # consecutive programs share one weight tile (N block) and walk the M blocks, so a weight
    # tile is read from memory once and reused from L2
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BM)
    pid_m = pid % num_m
    pid_n = pid // num_m
    rm = pid_m * BM + tl.arange(0, BM)
    m_ok = rm < M
    rn = pid_n * BN + tl.arange(0, BN)
    n_ok = rn < N
    # SWAP keeps everything transposed ([BN, BM], weights as the MMA's A operand); each
    # element's FP32 sequence acc + dot*xs*ws is unchanged, so the bits are too
    if SWAP:
        acc = tl.zeros([BN, BM], dtype=tl.float32)
        mn = rm[None, :] < M
        nn = n_ok[:, None]
        m_off = rm.to(tl.int64)[None, :]
        n_off = rn[:, None]
    else:
        acc = tl.zeros([BM, BN], dtype=tl.float32)
        mn = m_ok[:, None]
        nn = n_ok[None, :]
        m_off = rm.to(tl.int64)[:, None]
        n_off = rn[None, :]
    # constexpr G: runtime loop bounds break Triton 3.6's interpreter under numpy >= 2.4
    for g in range(0, G):
        c = codes(codes_ptr, rn, n_ok, g, True, G, code_row, code_group, code_off, SWAP, PREPARED, True)
        t = tl.load(t_ptr + m_off * t_sm + g, mask=mn, other=0)
        xs = tl.load(xs_ptr + m_off * xs_sm + g, mask=mn, other=0.0)
        ws = tl.load(scales_ptr + scale_off + n_off * scale_row + g * scale_group,
                     mask=nn, other=0.0).to(tl.float32)
        dot = plane_dots(c, tl.broadcast_to(-t, acc.shape), q_ptr, q_sm, rm, m_ok, g, True, SWAP, True, INTERP)
        acc = common.scale_accumulate(acc, dot, xs, ws)
        if WRITE_DOTS:
            tl.store(dots_ptr + m_off * d_sm + n_off * d_sn + g * d_sg, dot, mask=mn & nn)
    tl.store(out_ptr + m_off * out_sm + n_off * out_sn,
             prepare.to_out(acc, out_ptr.dtype.element_ty, INTERP), mask=mn & nn)


# A forced config (run/fold config=) is checked field by field (kernels.config).
FIELDS = {"BM": protocol.pow2(16), "BN": protocol.pow2(16), "SWAP": protocol.flag, "num_warps": protocol.WARPS,
          "num_stages": protocol.STAGES}


def config(n: int, k: int, m: int, interpret: bool | None = None) -> dict:
    """{BM, BN, SWAP, num_warps, num_stages} from shapes only (M bucketed to a power of two up
    to 4096). interpret: the interpreter's config or the GPU's (default: this process's)."""
    return dict(_chosen(n, k, m, interpret))


def _chosen(n, k, m, interpret) -> dict:
    return _config(n, k, min(triton.next_power_of_2(m), 4096),
                   common.INTERPRET if interpret is None else bool(interpret))


@functools.lru_cache(maxsize=None)
def _config(n: int, k: int, m_bucket: int, interpret: bool):
    if interpret:
        # the interpreter pays per program: few, wide tiles
        return dict(BM=max(16, min(m_bucket, 128)), BN=max(16, min(triton.next_power_of_2(n), 256)), SWAP=False,
                    num_warps=4, num_stages=1)
    # measured on the H200 (M = 512, 4096): 64 x 128 tiles, 4 warps beat 128 x 128 tiles. With
    # the packed planes (common.code_plane) the swapped operand order (weights as the MMA's A
    # operand) is 1.07-1.25x mmq on the large Bonsai shapes, but slower than unswapped on out
    # (5120 x 6144) at M = 2048 (results/2026-12-01-prefill-mmq-planes/prefill-swap.log)
    return dict(BM=64 if m_bucket >= 64 else 32, BN=128, SWAP=n * k >= 2 ** 26, num_warps=4, num_stages=3)


def configs(interpret: bool) -> list[dict]:
    """Every distinct config config() picks for the interpreter or the GPU (kernels.config)."""
    return protocol.sweep("mmq_planes", lambda n, k, m: config(n, k, m, interpret))


def _resolve(n, k, m, interpret, cfg) -> dict:
    return protocol.force("mmq_planes", _chosen(n, k, m, interpret), cfg, FIELDS)


def fold(n: int, k: int, m: int, interpret: bool | None = None, config: dict | None = None) -> dict:
    """The FP32 order (for the emulation): one split, one lane, groups ascending from 0.0,
    whatever the config (SWAP included; a forced one is still checked)."""
    _resolve(n, k, m, interpret, config)
    return dict(groups_per_split=k // 128, lanes=1, splits=1)


def run(x, w, *, out=None, dots=None, check=True, config=None):
    out = validate.kernel_out(__name__, x, w, out, dots, check)
    (m, k), n = x.shape, out.shape[1]
    if m == 0:
        return out
    cfg = _resolve(n, k, m, None, config)
    q, xs, t = prepare.quantize_q8(x, order="plane")
    bm, bn = cfg["BM"], cfg["BN"]
    st = w.strides
    write_dots = dots is not None
    dd = dots if write_dots else out
    ds = dots.stride() if write_dots else (0, 0, 0)
    grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)
    _mmq_planes_kernel[grid](
        q, q.stride(0), xs, xs.stride(0), t, t.stride(0),
        w.codes_u8, w.scales_f16, out, out.stride(0), out.stride(1),
        dd, ds[0], ds[1], ds[2],
        m, n, st["code_row"], st["code_group"], st["code_off"],
        st["scale_row"], st["scale_group"], st["scale_off"],
        BM=bm, BN=bn, G=w.groups, SWAP=cfg["SWAP"], PREPARED=w.layout == "prepared", WRITE_DOTS=write_dots,
        INTERP=common.INTERPRET, num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    return out
