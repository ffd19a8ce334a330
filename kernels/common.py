"""Shared Triton helpers. Each has an exact integer fallback for the interpreter, picked at
compile time through the INTERP constexpr (the interpreter runs neither inline PTX nor
libdevice rounding)."""
import os

import triton
import triton.language as tl

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")

# fp32(1/127): the reciprocal that compilers substitute for a division by 127 (SPEC §3).
RCP127 = 0.007874015718698502
# 1.5 * 2**23: adding and subtracting it rounds half to even for |x| < 2**22.
RNE_MAGIC = 12582912.0


@triton.jit
def rne(x):
    return (x + 12582912.0) - 12582912.0


@triton.jit
def dp4a(a, b, acc, INTERP: tl.constexpr, UNSIGNED_A: tl.constexpr = False):
    """acc + sum of the four byte products of int32 words a and b: signed bytes, or a's bytes
    unsigned (0..255) with UNSIGNED_A (gemv's masked code planes, up to 0xC0)."""
    if INTERP:
        r = acc
        for i in tl.static_range(4):
            if UNSIGNED_A:
                ai = (a >> (8 * i)) & 0xFF
            else:
                ai = (a << (24 - 8 * i)) >> 24
            bi = (b << (24 - 8 * i)) >> 24
            r = r + ai * bi
        return r
    elif UNSIGNED_A:
        return tl.inline_asm_elementwise(
            "dp4a.u32.s32 $0, $1, $2, $3;", "=r,r,r,r", [a, b, acc],
            dtype=tl.int32, is_pure=True, pack=1)
    else:
        return tl.inline_asm_elementwise(
            "dp4a.s32.s32 $0, $1, $2, $3;", "=r,r,r,r", [a, b, acc],
            dtype=tl.int32, is_pure=True, pack=1)


@triton.jit
def expand_signed(v, INTERP: tl.constexpr):
    """A code byte v (int32 holding 0..255, four 2-bit codes) to an int32 word of four signed
    bytes code-1, by a byte-permute lookup: LUT bytes FF 00 01 00 indexed by each code."""
    sel = (v & 3) | ((v << 2) & 0x30) | ((v << 4) & 0x300) | ((v << 6) & 0x3000)
    if INTERP:
        r = tl.zeros_like(v)
        for s in tl.static_range(4):
            c = ((v >> (2 * s)) & 3) - 1
            r = r | ((c & 0xFF) << (8 * s))
        return r
    else:
        return tl.inline_asm_elementwise(
            "prmt.b32 $0, $1, 0, $2;", "=r,r,r", [tl.full(sel.shape, 0x000100FF, tl.int32), sel],
            dtype=tl.int32, is_pure=True, pack=1)


@triton.jit
def code_plane(c, s: tl.constexpr, INTERP: tl.constexpr):
    """Plane s of code bytes c (uint8, four 2-bit codes each): (c >> 2s) & 3 as int8. On CUDA one
    32-bit shift and AND per four bytes (inline PTX, pack=4: the mask drops the bits a shift
    moves across bytes, so how bytes are packed does not matter); Triton's own byte ops cost
    about three instructions a byte."""
    if INTERP:
        return ((c >> (2 * s)) & 3).to(tl.int8)
    elif s == 0:
        return tl.inline_asm_elementwise("and.b32 $0, $1, 0x03030303;", "=r,r", [c],
                                         dtype=tl.int8, is_pure=True, pack=4)
    elif s == 1:
        return tl.inline_asm_elementwise("{.reg .b32 t; shr.b32 t, $1, 2; and.b32 $0, t, 0x03030303;}",
                                         "=r,r", [c], dtype=tl.int8, is_pure=True, pack=4)
    elif s == 2:
        return tl.inline_asm_elementwise("{.reg .b32 t; shr.b32 t, $1, 4; and.b32 $0, t, 0x03030303;}",
                                         "=r,r", [c], dtype=tl.int8, is_pure=True, pack=4)
    else:
        return tl.inline_asm_elementwise("{.reg .b32 t; shr.b32 t, $1, 6; and.b32 $0, t, 0x03030303;}",
                                         "=r,r", [c], dtype=tl.int8, is_pure=True, pack=4)


@triton.jit
def scale_accumulate(acc, dot, xs, ws):
    """The one FP32 expression every integer path uses to fold a group into its sum: keeping
    it in one place is what lets mmq and mmq_planes be bit-identical."""
    return acc + dot.to(tl.float32) * xs * ws


@triton.jit
def lane_tree(lanes, BN: tl.constexpr, GC: tl.constexpr, LOG_GC: tl.constexpr):
    """[BN, GC] FP32 lanes -> [BN] by an explicit pairwise tree ((l0+l1)+(l2+l3))+..., so the
    order does not depend on the register layout the compiler picks (tl.sum's would)."""
    y = lanes
    for r in tl.static_range(LOG_GC):
        lo, hi = tl.split(tl.reshape(y, (BN, GC >> (r + 1), 2)))
        y = lo + hi
    return tl.reshape(y, (BN,))
