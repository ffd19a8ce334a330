"""mmq (legacy prefill, M > 16): Q8 plain; per 128-group an INT8 tensor-core tl.dot of the q
tile [BM, 128] with the weights expanded to int8 (code-1) [128, BN], exact in int32, folded as
acc = scale_accumulate(acc, dot_g, xs[m, g], ws[n, g]) for g ascending. mmq_planes must stay
bit-identical to this: keep the fold exactly so and nothing else in the FP32 path."""
import functools

import triton
import triton.language as tl

from kernels.common import INTERPRET, scale_accumulate
from kernels.prepare import quantize_q8, to_out
from kernels import config as protocol, validate


@triton.jit
def _mmq_kernel(q_ptr, xs_ptr, c_ptr, s_ptr, y_ptr, d_ptr, M, N, stride_ym,
                code_row, code_group, code_off, scale_row, scale_group, scale_off,
                G: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                DOTS: tl.constexpr, INTERP: tl.constexpr):
    # program_id(0) walks M fastest, so programs running together share one weight tile in L2
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    mmask = rm < M
    nmask = rn < N
    k = tl.arange(0, 128)
    b = tl.arange(0, 32)
    shift = 2 * tl.arange(0, 4)
    q_ptrs = q_ptr + rm.to(tl.int64)[:, None] * (G * 128) + k[None, :]
    c_ptrs = c_ptr + rn.to(tl.int64)[:, None] * code_row + code_off + b[None, :]   # [BN, 32] bytes
    s_ptrs = s_ptr + rn.to(tl.int64) * scale_row + scale_off
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for g in range(G):   # G constexpr: the interpreter (numpy 2) cannot loop to a runtime scalar
        qt = tl.load(q_ptrs + g * 128, mask=mmask[:, None], other=0)
        by = tl.load(c_ptrs + g * code_group, mask=nmask[:, None], other=0).to(tl.int32)
        # weight 4b+s of the group is (byte[b] >> 2s) & 3, minus 1; as [BN, 128], K contiguous
        wt = tl.reshape(((by[:, :, None] >> shift[None, None, :]) & 3) - 1, (BN, 128)).to(tl.int8)
        dot = tl.dot(qt, tl.trans(wt), out_dtype=tl.int32)
        xs = tl.load(xs_ptr + rm * G + g, mask=mmask, other=0.0)
        ws = tl.load(s_ptrs + g * scale_group, mask=nmask, other=0.0).to(tl.float32)
        acc = scale_accumulate(acc, dot, xs[:, None], ws[None, :])
        if DOTS:
            d_off = (rm.to(tl.int64)[:, None] * N + rn[None, :]) * G + g
            tl.store(d_ptr + d_off, dot, mask=mmask[:, None] & nmask[None, :])
    y_ptrs = y_ptr + rm.to(tl.int64)[:, None] * stride_ym + rn[None, :]
    tl.store(y_ptrs, to_out(acc, y_ptr.dtype.element_ty, INTERP), mask=mmask[:, None] & nmask[None, :])


# A forced config (run/fold config=) is checked field by field (kernels.config).
FIELDS = {"BM": protocol.pow2(16), "BN": protocol.pow2(16), "num_warps": protocol.WARPS, "num_stages": protocol.STAGES}


def config(n: int, k: int, m: int, interpret: bool | None = None) -> dict:
    """{BM, BN, num_warps, num_stages} from shapes only (M bucketed to a power of two up to
    4096). interpret: the interpreter's config or the GPU's (default: this process's)."""
    return dict(_chosen(n, k, m, interpret))


def _chosen(n, k, m, interpret) -> dict:
    return _config(n, k, min(triton.next_power_of_2(m), 4096), INTERPRET if interpret is None else bool(interpret))


@functools.lru_cache(maxsize=None)
def _config(n, k, m, interpret):
    if interpret:
        return dict(BM=max(16, min(m, 128)), BN=max(16, min(triton.next_power_of_2(n), 256)), num_warps=4, num_stages=1)
    # H200 sweep, 34816x5120 bf16: M=4096 (256, 64, 8, 3) 3.80 ms (384 Top/s; 128x128x8 5.16 ms),
    # M=512 the same tile 0.53 ms, M=128 (128, 64, 4, 3) 0.18 ms, M=64 (64, 64, 4, 4) 0.12 ms.
    # A small BN keeps the per-group weight decode and the fp32 fold cheap per program.
    if m <= 64:
        bm, bn, warps, stages = 64, 64, 4, 4
    elif m <= 128:
        bm, bn, warps, stages = 128, 64, 4, 3
    else:
        bm, bn, warps, stages = 256, 64, 8, 3
    return dict(BM=bm, BN=bn, num_warps=warps, num_stages=stages)


def configs(interpret: bool) -> list[dict]:
    """Every distinct config config() picks for the interpreter or the GPU (kernels.config)."""
    return protocol.sweep("mmq", lambda n, k, m: config(n, k, m, interpret))


def _resolve(n, k, m, interpret, cfg) -> dict:
    return protocol.force("mmq", _chosen(n, k, m, interpret), cfg, FIELDS)


def fold(n: int, k: int, m: int, interpret: bool | None = None, config: dict | None = None) -> dict:
    """The FP32 order (for the emulation): one split, one lane, groups ascending from 0.0,
    whatever the config (a forced one is still checked)."""
    _resolve(n, k, m, interpret, config)
    return dict(groups_per_split=k // 128, lanes=1, splits=1)


def run(x, w, *, out=None, dots=None, check=True, config=None):
    y = validate.kernel_out(__name__, x, w, out, dots, check)
    m, n = y.shape
    if m == 0 or n == 0:
        return y
    cfg = _resolve(n, w.k, m, None, config)
    q, xs, _ = quantize_q8(x, "plain")
    bm, bn = cfg["BM"], cfg["BN"]
    st = w.strides
    _mmq_kernel[(triton.cdiv(m, bm), triton.cdiv(n, bn))](
        q, xs, w.codes_u8, w.scales_f16, y, dots if dots is not None else y,
        m, n, y.stride(0),
        st["code_row"], st["code_group"], st["code_off"], st["scale_row"], st["scale_group"], st["scale_off"],
        G=w.groups, BM=bm, BN=bn, DOTS=dots is not None, INTERP=INTERPRET,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    return y
