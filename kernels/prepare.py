"""Activation and weight preparation: Q8 quantization (SPEC §3), the blockwise Hadamard
rotation, and the raw -> prepared weight copy. Also `to_out`, the output cast every path
uses (the interpreter's own fp32 -> bf16 cast truncates, so it needs a fallback)."""
import functools
import math

import torch
import triton
import triton.language as tl

from kernels.common import INTERPRET, RCP127, rne

GROUP = 128
_RCP127 = tl.constexpr(RCP127)   # a jit function reads module globals only as constexpr


@triton.jit
def to_out(y, DTYPE: tl.constexpr, INTERP: tl.constexpr):
    """Round fp32 y to DTYPE to nearest even. Triton 3.6's interpreter truncates fp32 -> bf16
    and zeroes or garbles subnormals, so there the rounding is done on the bits and the top
    half is bitcast. A NaN keeps its sign and gets the quiet bit: rounding a payload held in
    the low 16 bits would carry into inf or wrap to zero (tests/test_rounding.py)."""
    if INTERP and DTYPE == tl.bfloat16:
        b = y.to(tl.int32, bitcast=True)
        r = (b + (0x7FFF + ((b >> 16) & 1))) >> 16
        r = tl.where(y != y, (b >> 16) | 0x40, r)
        return r.to(tl.int16).to(tl.bfloat16, bitcast=True)
    else:
        return y.to(DTYPE)


@triton.jit
def to_f32(v, INTERP: tl.constexpr):
    """v as fp32 (exact). Triton 3.6's interpreter garbles bf16 subnormals in this conversion;
    a bf16 is the top half of an fp32, so there its bits are shifted instead."""
    if INTERP and v.dtype == tl.bfloat16:
        return (v.to(tl.int16, bitcast=True).to(tl.int32) << 16).to(tl.float32, bitcast=True)
    else:
        return v.to(tl.float32)


# --- Q8 quantization -------------------------------------------------------------------

@triton.jit
def _quantize_kernel(x_ptr, q_ptr, s_ptr, t_ptr, U, G, stride_xm, zero_ptr, Z, stride_sg,
                     BU: tl.constexpr, PLANE: tl.constexpr, PDL: tl.constexpr, ZB: tl.constexpr,
                     BYG: tl.constexpr, INTERP: tl.constexpr):
    if PDL:
        # launched with programmatic dependent launch: let the consumer launch (it prefetches
        # its weights), then wait for the producer of x before reading it or writing anything
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    if ZB > 0:
        # zero the consumer's Z split-K arrival counters (program 0; after the wait, since the
        # memory may have been freed by an earlier kernel that still reads it)
        if tl.program_id(0) == 0:
            z = tl.arange(0, ZB)
            tl.store(zero_ptr + z, tl.zeros([ZB], dtype=tl.int32), mask=z < Z)
    # One program: BU (row, group) units u = m*G + g, each group as [32, 4] = (b, s), element
    # 4b+s. Outputs are contiguous in u: scales/sums at u, codes at u*128.
    u = tl.program_id(0) * BU + tl.arange(0, BU)
    umask = u < U
    m = u // G
    c = tl.arange(0, 128)
    mask = umask[:, None] & (c >= 0)[None, :]
    src = (m.to(tl.int64) * stride_xm + (u - m * G) * 128)[:, None] + c[None, :]
    a = tl.reshape(to_f32(tl.load(x_ptr + src, mask=mask, other=0.0), INTERP), (BU, 32, 4))
    amax = tl.max(tl.max(tl.abs(a), axis=2), axis=1)
    # tl.max drops NaN, so a NaN group would get a finite scale and finite, wrong outputs:
    # give it a NaN scale, which every integer path multiplies into the affected row.
    has_nan = tl.max(tl.max((a != a).to(tl.int32), axis=2), axis=1)
    scale = tl.where(has_nan != 0, float("nan"), amax * _RCP127)
    div = tl.where(scale == 0.0, 1.0, scale)
    q = tl.math.div_rn(a, div[:, None, None])
    q = tl.minimum(tl.maximum(rne(q), -127.0), 127.0).to(tl.int32)
    t = tl.sum(tl.sum(q, axis=2), axis=1)
    if PLANE:
        q = tl.permute(q, (0, 2, 1))   # element 4b+s goes to s*32+b
    dst = u.to(tl.int64)[:, None] * 128 + c[None, :]
    tl.store(q_ptr + dst, tl.reshape(q, (BU, 128)).to(tl.int8), mask=mask)
    if BYG:
        # scales by group, [G, rows] at row stride stride_sg: mmq_wgmma's TMA box of one group
        tl.store(s_ptr + (u - m * G).to(tl.int64) * stride_sg + m, scale, mask=umask)
    else:
        tl.store(s_ptr + u, scale, mask=umask)
    tl.store(t_ptr + u, t, mask=umask)


def _quantize_config(units, interpret=None):
    """(BU, warps) for `units` groups. interpret: the interpreter's config or the GPU's (default:
    this process's), so a GPU launch can be described from an interpreting process."""
    return _quantize_config_for(units, INTERPRET if interpret is None else bool(interpret))


@functools.lru_cache(maxsize=None)
def _quantize_config_for(units, interpret):
    if interpret:
        return min(triton.next_power_of_2(units), 256), 4   # few programs: the interpreter pays per program
    return min(triton.next_power_of_2(units), 8), 4         # 1024 values a program


def quantize_q8(x, order="plain", pdl=False, zero=None, by_group=False, out=None):
    """Q8 with group 128 (SPEC §3): -> (q int8 [M,K], scales fp32 [M,G], sums int32 [M,G]).
    pdl: launch with programmatic dependent launch (CUDA only; see kernels/gemv.py).
    zero: an int32 tensor the kernel also fills with zeros (a consumer's split-K counters).
    by_group: scales as a [G, M] view of rows padded to 16 bytes (one group's scales of a tile
    of tokens are one TMA box: mmq_wgmma). out: (q, scales, sums) buffers of those shapes to
    write instead of new ones (a caller's workspace; the scales' row stride is kept)."""
    if order not in ("plain", "plane"):
        raise ValueError(f"order: expected 'plain' or 'plane', got {order!r}")
    m, k = x.shape
    g = k // GROUP
    if out is not None:
        q, sc, sums = out
    else:
        q = torch.empty((m, k), dtype=torch.int8, device=x.device)
        sc = (torch.empty((g, -(-m // 4) * 4), dtype=torch.float32, device=x.device)[:, :m] if by_group else
              torch.empty((m, g), dtype=torch.float32, device=x.device))
        sums = torch.empty((m, g), dtype=torch.int32, device=x.device)
    if m == 0 or g == 0:
        return q, sc, sums
    units = m * g
    bu, warps = _quantize_config(units)
    _quantize_kernel[(triton.cdiv(units, bu),)](
        x, q, sc, sums, units, g, x.stride(0), sums if zero is None else zero,
        0 if zero is None else zero.numel(), sc.stride(0) if by_group else 0, BU=bu, PLANE=order == "plane",
        PDL=bool(pdl), ZB=0 if zero is None or not zero.numel() else triton.next_power_of_2(zero.numel()),
        BYG=bool(by_group), INTERP=INTERPRET, num_warps=warps, launch_pdl=bool(pdl))
    return q, sc, sums


# --- Hadamard rotation -------------------------------------------------------------------

@triton.jit
def _rotate_kernel(x_ptr, sg_ptr, y_ptr, M, K, stride_xm, sign_stride, inv_sqrt,
                   BR: tl.constexpr, B: tl.constexpr, LOGB: tl.constexpr, INTERP: tl.constexpr):
    # One program: BR rows x one block of B columns. Fast Walsh-Hadamard by LOGB identical
    # stages z[2j] = v[j] + v[j+B/2], z[2j+1] = v[j] - v[j+B/2]; LOGB of them give the
    # Sylvester H_B exactly (each stage handles the top index bit and rotates it to the bottom).
    r = tl.program_id(0) * BR + tl.arange(0, BR)
    blk = tl.program_id(1)
    c = tl.arange(0, B)
    rmask = r < M
    col = blk * B + c
    v = to_f32(tl.load(x_ptr + r[:, None].to(tl.int64) * stride_xm + col[None, :],
                       mask=rmask[:, None], other=0.0), INTERP)
    sgn = tl.load(sg_ptr + blk * sign_stride + c).to(tl.float32)
    v = v * sgn[None, :]
    for _ in tl.static_range(LOGB):
        v3 = tl.permute(tl.reshape(v, (BR, 2, B // 2)), (0, 2, 1))
        lo, hi = tl.split(v3)
        v = tl.reshape(tl.join(lo + hi, lo - hi), (BR, B))
    v = v * inv_sqrt
    tl.store(y_ptr + r[:, None].to(tl.int64) * K + col[None, :],
             to_out(v, y_ptr.dtype.element_ty, INTERP), mask=rmask[:, None])


@functools.lru_cache(maxsize=None)
def _rotate_config(m, block):
    if INTERPRET:
        br = min(triton.next_power_of_2(max(m, 1)), 64)
    else:
        br = max(1, min(4096 // block, triton.next_power_of_2(max(m, 1))))
    return br, 4


def rotate(x, signs, block=1024):
    """y_blk = H_B (x_blk * signs) / sqrt(B) per block of B columns (Sylvester H), in fp32,
    returned in x's dtype. signs: B values (one vector for every block) or K values."""
    m, k = x.shape
    if block < 2 or block & (block - 1) or k % block:
        raise ValueError(f"rotate: block {block} must be a power of two dividing K={k}")
    if signs.numel() not in (block, k):
        raise ValueError(f"rotate: signs must have {block} or {k} values, got {signs.numel()}")
    y = torch.empty((m, k), dtype=x.dtype, device=x.device)
    if m == 0:
        return y
    signs = signs.reshape(-1)
    if signs.dtype == torch.bool:
        raise ValueError("rotate: signs must be numbers +-1, not bool")
    br, warps = _rotate_config(m, block)
    _rotate_kernel[(triton.cdiv(m, br), k // block)](
        x, signs, y, m, k, x.stride(0), 0 if signs.numel() == block else block, 1.0 / math.sqrt(block),
        BR=br, B=block, LOGB=block.bit_length() - 1, INTERP=INTERPRET, num_warps=warps)
    return y


# --- raw -> prepared weights -------------------------------------------------------------

@triton.jit
def _prepare_kernel(src_ptr, dst_ptr, N, RS, CODE_BYTES,
                    BN: tl.constexpr, BT: tl.constexpr):
    # Read each raw row contiguously; byte p of block g goes to the code plane (p >= 2) or to
    # the scale plane (p < 2).
    n = tl.program_id(0) * BN + tl.arange(0, BN)
    t = tl.program_id(1) * BT + tl.arange(0, BT)
    mask = (n < N)[:, None] & (t < RS)[None, :]
    n64 = n.to(tl.int64)[:, None]
    v = tl.load(src_ptr + n64 * RS + t[None, :], mask=mask)
    g = t // 34
    p = t - g * 34
    gs = RS // 34
    code_dst = n64 * (gs * 32) + (g * 32 + p - 2)[None, :]
    scale_dst = CODE_BYTES + n64 * (gs * 2) + (g * 2 + p)[None, :]
    tl.store(dst_ptr + tl.where((p >= 2)[None, :], code_dst, scale_dst), v, mask=mask)


def raw_to_prepared(w):
    """A raw PQ2Weight -> a prepared one (one new allocation, equal to w.to_prepared() byte for
    byte). A raw uint8 matrix [N, G*34] gives the flat prepared bytes instead."""
    from kernels.format import BLOCK_BYTES, PQ2Weight
    if isinstance(w, torch.Tensor):
        return raw_to_prepared(PQ2Weight.from_raw(w, validate=False)).data
    if w.layout == "prepared":
        return w
    n, k = w.n, w.k
    rs = k // GROUP * BLOCK_BYTES
    flat = torch.empty(n * rs, dtype=torch.uint8, device=w.device)
    if n:
        bn, bt = (64, triton.next_power_of_2(rs)) if INTERPRET else (4, 1024)
        _prepare_kernel[(triton.cdiv(n, bn), triton.cdiv(rs, bt))](
            w.data, flat, n, rs, n * k // 4, BN=bn, BT=bt, num_warps=4)
    return PQ2Weight(flat, n, k, "prepared")
