"""int_gemv (legacy, M 1-16): Q8 plain quantization, then a GEMV over all M rows in one launch.
Code bytes become signed int8 words by the byte-permute lookup (common.expand_signed) and meet
int32 words of activation codes in DP4A (common.dp4a); each group's dot is exact in int32 and
is folded by common.scale_accumulate in ascending group order."""
import functools

import torch
import triton
import triton.language as tl

from kernels.common import INTERPRET, dp4a, expand_signed, scale_accumulate
from kernels.prepare import quantize_q8, to_out
from kernels import config as protocol, validate


@triton.jit
def _gemv_kernel(qw_ptr, xs_ptr, c_ptr, s_ptr, y_ptr, d_ptr, M, N, stride_ym,
                 code_row, code_group, code_off, scale_row, scale_group, scale_off,
                 G: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, GB: tl.constexpr,
                 DOTS: tl.constexpr, INTERP: tl.constexpr):
    # Each step loads GB groups at once (enough bytes in flight for a memory-bound GEMV),
    # computes their GB dots in parallel, then folds them one by one in ascending order.
    rn = tl.program_id(0) * BN + tl.arange(0, BN)
    rm = tl.arange(0, BM)
    j = tl.arange(0, GB)
    b = tl.arange(0, 32)
    nmask = rn < N
    mmask = rm < M
    xw_off = rm[:, None, None] * (G * 32) + j[None, :, None] * 32 + b[None, None, :]               # [BM, GB, 32] words
    c_off = rn.to(tl.int64)[:, None, None] * code_row + code_off + j[None, :, None] * code_group + b[None, None, :]
    s_ptrs = s_ptr + rn.to(tl.int64) * scale_row + scale_off
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    zero = tl.zeros((BM, BN, GB, 32), dtype=tl.int32)
    for g0 in range(0, G, GB):   # G constexpr: the interpreter (numpy 2) cannot loop to a runtime scalar
        gmask = (g0 + j) < G
        xw = tl.load(qw_ptr + xw_off + g0 * 32, mask=mmask[:, None, None] & gmask[None, :, None], other=0)
        # masked weight rows and groups read 0x55 (four codes 1 = zeros)
        cb = tl.load(c_ptr + c_off + g0 * code_group, mask=nmask[:, None, None] & gmask[None, :, None],
                     other=0x55).to(tl.int32)
        ww = expand_signed(cb, INTERP)
        p = dp4a(tl.broadcast_to(xw[:, None, :, :], (BM, BN, GB, 32)),
                 tl.broadcast_to(ww[None, :, :, :], (BM, BN, GB, 32)), zero, INTERP)
        dots = tl.sum(p, axis=3)                                                                  # [BM, BN, GB]
        if DOTS:
            d_off = (rm.to(tl.int64)[:, None, None] * N + rn[None, :, None]) * G + g0 + j[None, None, :]
            tl.store(d_ptr + d_off, dots, mask=mmask[:, None, None] & nmask[None, :, None] & gmask[None, None, :])
        for i in tl.static_range(GB):
            if g0 + i < G:   # skip the padding groups of the last step
                dot = tl.sum(tl.where(j[None, None, :] == i, dots, 0), axis=2)                   # exact: one term
                xs = tl.load(xs_ptr + rm * G + (g0 + i), mask=mmask, other=0.0)
                ws = tl.load(s_ptrs + (g0 + i) * scale_group, mask=nmask, other=0.0).to(tl.float32)
                acc = scale_accumulate(acc, dot, xs[:, None], ws[None, :])
    y_ptrs = y_ptr + rm.to(tl.int64)[:, None] * stride_ym + rn[None, :]
    tl.store(y_ptrs, to_out(acc, y_ptr.dtype.element_ty, INTERP), mask=mmask[:, None] & nmask[None, :])


# A forced config (run/fold config=) is checked field by field (kernels.config); BM >= M too.
FIELDS = {"BM": protocol.pow2(1), "BN": protocol.pow2(1), "GB": protocol.pow2(1), "num_warps": protocol.WARPS,
          "num_stages": protocol.STAGES}


def config(n: int, k: int, m: int, interpret: bool | None = None) -> dict:
    """{BM, BN, GB, num_warps, num_stages} from shapes only; one program holds all M rows (BM).
    interpret: the interpreter's config or the GPU's (default: this process's)."""
    return dict(_config(n, k, m, INTERPRET if interpret is None else bool(interpret)))


@functools.lru_cache(maxsize=None)
def _config(n, k, m, interpret):
    """Picked by a sweep on the H200 (bf16, prepared weights): M=1 34816x5120 (16, 4, 2) 53 us;
    5120x17408 (8, 8, 4) 47 us; M=16 34816x5120 (16, 1, 4) 261 us; 5120x17408 (8, 4, 4) 158 us.
    M = 2..8 are in between."""
    bm = triton.next_power_of_2(m)
    g = k // 128
    if interpret:
        return dict(BM=bm, BN=max(16, min(triton.next_power_of_2(n), 4096 // bm)), GB=min(triton.next_power_of_2(g), 4),
                    num_warps=4, num_stages=1)
    big_n = n >= 16384
    if bm == 1:
        bn, gb, warps = (16, 4, 2) if big_n else (8, 8, 4)
    elif bm <= 4:
        bn, gb, warps = (16, 2, 4) if big_n else (8, 4, 4)
    else:
        bn, gb, warps = (16, 1, 4) if big_n else (8, 4 if k >= 12288 else 2, 4)
    return dict(BM=bm, BN=bn, GB=gb, num_warps=warps, num_stages=1)


def configs(interpret: bool) -> list[dict]:
    """Every distinct config config() picks for the interpreter or the GPU (kernels.config)."""
    return protocol.sweep("int_gemv", lambda n, k, m: config(n, k, m, interpret))


def _resolve(n, k, m, interpret, cfg) -> dict:
    c = protocol.force("int_gemv", _config(n, k, m, INTERPRET if interpret is None else bool(interpret)), cfg, FIELDS)
    if c["BM"] < m:
        raise ValueError(f"int_gemv: config field BM={c['BM']}: one program holds all M={m} rows; expected BM >= {m}")
    return c


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
    _gemv_kernel[(triton.cdiv(n, bn),)](
        q.view(torch.int32), xs, w.codes_u8, w.scales_f16, y, dots if dots is not None else y,
        m, n, y.stride(0),
        st["code_row"], st["code_group"], st["code_off"], st["scale_row"], st["scale_group"], st["scale_off"],
        G=w.groups, BM=bm, BN=bn, GB=cfg["GB"], DOTS=dots is not None, INTERP=INTERPRET,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    return y
