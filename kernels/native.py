"""native (legacy, any M): floating arithmetic on packed weights decoded in the kernel; no
activation quantization. Per 128-group: a tl.dot of the x tile (x's dtype) with the decoded
ternary values (code-1, exact in bf16/fp16), fp32 accumulate, times the fp16 scale as fp32;
groups summed in ascending order in fp32."""
import functools

import triton
import triton.language as tl

from kernels.common import INTERPRET
from kernels.prepare import to_out
from kernels import config as protocol, validate


@triton.jit
def _native_kernel(x_ptr, c_ptr, s_ptr, y_ptr, M, N, stride_xm, stride_ym,
                   code_row, code_group, code_off, scale_row, scale_group, scale_off,
                   G: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, INTERP: tl.constexpr):
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    mmask = rm < M
    nmask = rn < N
    k = tl.arange(0, 128)
    b = tl.arange(0, 32)
    shift = 2 * tl.arange(0, 4)
    x_ptrs = x_ptr + rm.to(tl.int64)[:, None] * stride_xm + k[None, :]
    c_ptrs = c_ptr + rn.to(tl.int64)[:, None] * code_row + code_off + b[None, :]   # [BN, 32] bytes
    s_ptrs = s_ptr + rn.to(tl.int64) * scale_row + scale_off
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for g in range(G):   # G constexpr: the interpreter (numpy 2) cannot loop to a runtime scalar
        xt = tl.load(x_ptrs + g * 128, mask=mmask[:, None], other=0.0)
        by = tl.load(c_ptrs + g * code_group, mask=nmask[:, None], other=0).to(tl.int32)
        # weight 4b+s of the group is (byte[b] >> 2s) & 3, minus 1
        wv = tl.reshape(((by[:, :, None] >> shift[None, None, :]) & 3) - 1, (BN, 128))
        if INTERP:
            # the interpreter's bf16 dot and int->bf16 casts are wrong; fp32 is exact here
            d = tl.dot(xt.to(tl.float32), tl.trans(wv.to(tl.float32)), input_precision="ieee")
        else:
            d = tl.dot(xt, tl.trans(wv.to(xt.dtype)))
        ws = tl.load(s_ptrs + g * scale_group, mask=nmask, other=0.0).to(tl.float32)
        acc += d * ws[None, :]
    y_ptrs = y_ptr + rm.to(tl.int64)[:, None] * stride_ym + rn[None, :]
    tl.store(y_ptrs, to_out(acc, y_ptr.dtype.element_ty, INTERP), mask=mmask[:, None] & nmask[None, :])


# A forced config (run/fold config=) is checked field by field (kernels.config).
FIELDS = {"BM": protocol.pow2(16), "BN": protocol.pow2(16), "num_warps": protocol.WARPS, "num_stages": protocol.STAGES}


def config(n: int, k: int, m: int, interpret: bool | None = None) -> dict:
    """{BM, BN, num_warps, num_stages} from shapes only (M bucketed: itself up to 16, then a
    power of two up to 4096). interpret: the interpreter's config or the GPU's (default: this
    process's)."""
    return dict(_chosen(n, k, m, interpret))


def _chosen(n, k, m, interpret=None) -> dict:
    return _config(n, k, m if m <= 16 else min(triton.next_power_of_2(m), 4096),
                   INTERPRET if interpret is None else bool(interpret))


@functools.lru_cache(maxsize=None)
def _config(n, k, m, interpret):
    if interpret:
        return dict(BM=max(16, min(triton.next_power_of_2(m), 64)), BN=max(16, min(triton.next_power_of_2(n), 256)),
                    num_warps=4, num_stages=1)
    # H200 sweep, bf16: M<=16 34816x5120 (16, 32, 2, 4) 120 us, 5120x6144 (16, 16, 2, 4) 37 us
    # (decode is bound by the in-kernel weight decode, not memory); M=4096 34816x5120
    # (256, 64, 8, 3) 5.13 ms, 128x128x8 5.28 ms.
    if m <= 16:
        bm, bn, warps, stages = 16, 32 if n >= 16384 else 16, 2, 4
    elif m <= 64:
        bm, bn, warps, stages = 64, 64, 4, 4
    elif m <= 256:
        bm, bn, warps, stages = 128, 128, 8, 3
    else:
        bm, bn, warps, stages = 256, 64, 8, 3
    return dict(BM=bm, BN=bn, num_warps=warps, num_stages=stages)


def configs(interpret: bool) -> list[dict]:
    """Every distinct config config() picks for the interpreter or the GPU (kernels.config)."""
    return protocol.sweep("native", lambda n, k, m: config(n, k, m, interpret))


def _resolve(n, k, m, interpret, cfg) -> dict:
    return protocol.force("native", _chosen(n, k, m, interpret), cfg, FIELDS)


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
    bm, bn = cfg["BM"], cfg["BN"]
    st = w.strides
    _native_kernel[(triton.cdiv(m, bm), triton.cdiv(n, bn))](
        x, w.codes_u8, w.scales_f16, y, m, n, x.stride(0), y.stride(0),
        st["code_row"], st["code_group"], st["code_off"], st["scale_row"], st["scale_group"], st["scale_off"],
        G=w.groups, BM=bm, BN=bn, INTERP=INTERPRET, num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    return y
