"""Q8 activation quantization in groups of 128 (SPEC §3), reproducing the FP32 arithmetic exactly.

Per group: a in fp32; amax = max|a|; scale = fp32(amax * fp32(1/127)) (a reciprocal multiply, as
compilers lower the division by 127); q = clip(rint(fp32(a / scale)), -127, 127) with a correctly
rounded fp32 division (numpy's float32 division is), dividing by 1 where scale == 0; np.rint
rounds half to even. Subnormal values are kept (no flush to zero), as the spec's arithmetic says.
Plane order: element 4*b + s of a group is stored at s*32 + b.
"""
from typing import NamedTuple

import numpy as np

from . import to_numpy

GROUP = 128
INV127 = np.float32(1 / 127)   # correctly rounded fp32(1/127); a test checks it exactly
ORDERS = ("plain", "plane")

__all__ = ["GROUP", "INV127", "Q8", "quantize_q8", "dequantize_q8", "to_fp32",
           "to_plane", "from_plane"]


class Q8(NamedTuple):
    q: np.ndarray       # int8 [M, K], plain or plane order
    scales: np.ndarray  # float32 [M, G]
    sums: np.ndarray    # int32 [M, G], sum of the group's q (order does not matter)


def to_fp32(a) -> np.ndarray:
    """Activations [M, K] (torch bf16/fp16/fp32 or numpy float) as float32 [M, G, 128].
    bf16/fp16 convert exactly; float64 is rounded to nearest-even fp32 ("converted to FP32 first")."""
    x = to_numpy(a)
    if x.dtype.kind != "f":
        raise TypeError(f"activations: expected a float dtype (bf16, fp16, fp32), got {x.dtype}")
    if x.ndim != 2:
        raise ValueError(f"activations: expected a matrix [M, K] (rank 2), got rank {x.ndim}")
    m, k = x.shape
    if k == 0 or k % GROUP:
        raise ValueError(f"activations: K={k} is not a positive multiple of {GROUP}")
    x = x.astype(np.float32)
    bad = ~np.isfinite(x)
    if bad.any():
        r, c = np.unravel_index(int(np.argmax(bad)), bad.shape)
        raise ValueError(f"activations: non-finite value {x[r, c]} at row {r}, group {c // GROUP} "
                         "(Q8 of NaN/Inf is undefined)")
    return x.reshape(m, k // GROUP, GROUP)


def _check_order(order):
    if order not in ORDERS:
        raise ValueError(f"order: expected 'plain' or 'plane', got {order!r}")


def to_plane(q: np.ndarray) -> np.ndarray:
    """[..., K] plain order -> plane order: element 4*b + s of each group moves to s*32 + b."""
    q = np.asarray(q)
    lead, k = q.shape[:-1], q.shape[-1]
    g = q.reshape(*lead, k // GROUP, 32, 4)          # [..., group, b, s]
    return np.swapaxes(g, -1, -2).reshape(*lead, k)  # [..., group, s, b]


def from_plane(q: np.ndarray) -> np.ndarray:
    """Inverse of to_plane."""
    q = np.asarray(q)
    lead, k = q.shape[:-1], q.shape[-1]
    g = q.reshape(*lead, k // GROUP, 4, 32)          # [..., group, s, b]
    return np.swapaxes(g, -1, -2).reshape(*lead, k)  # [..., group, b, s]


def quantize_q8(a, *, order="plain") -> Q8:
    """Q8 of activations a [M, K]: q int8 [M, K], scales float32 [M, G], sums int32 [M, G]."""
    _check_order(order)
    x = to_fp32(a)                                           # float32 [M, G, 128]
    m, g, _ = x.shape
    amax = np.abs(x).max(axis=-1)                            # float32, exact
    scale = (amax * INV127).astype(np.float32)               # one fp32 rounding
    div = np.where(scale == 0, np.float32(1), scale).astype(np.float32)
    quot = (x / div[:, :, None]).astype(np.float32)          # correctly rounded fp32 division
    q = np.clip(np.rint(quot), -127, 127).astype(np.int8)    # rint: half to even
    sums = q.astype(np.int32).sum(axis=-1, dtype=np.int32)
    q = q.reshape(m, g * GROUP)
    if order == "plane":
        q = to_plane(q)
    return Q8(np.ascontiguousarray(q), scale, sums)


def dequantize_q8(q8: Q8, *, order="plain") -> np.ndarray:
    """float64 [M, K] values q * scale (exact: 8-bit times 24-bit fits in float64), plain order."""
    _check_order(order)
    q = np.asarray(q8.q)
    if order == "plane":
        q = from_plane(q)
    m, k = q.shape
    x = q.astype(np.float64).reshape(m, k // GROUP, GROUP) * np.asarray(q8.scales, np.float64)[:, :, None]
    return x.reshape(m, k)
