"""FP64 references of y = x @ W.T for the kernel paths (SPEC §4).

weight: the packed PQ2_0 bytes (numpy or torch, any device): a raw uint8 matrix [N, K/128*34],
or with layout="prepared", n= and k= the prepared flat buffer (reference.pq2 decodes them; a
runtime weight w is passed as w.data, layout=w.layout, n=w.n, k=w.k). rows: optional integer
indices of output columns n to compute (a sample of N for large shapes); the result's columns
follow `rows`.
"""
import numpy as np

from . import pq2, to_float64
from .q8 import GROUP, quantize_q8

__all__ = ["dense", "floating", "group_dots", "quantized"]


def _x64(x, k=None) -> np.ndarray:
    x = to_float64(x)
    if x.ndim != 2:
        raise ValueError(f"x: expected a matrix [M, K] (rank 2), got rank {x.ndim}")
    if k is not None and x.shape[1] != k:
        raise ValueError(f"x: K={x.shape[1]} does not match the weight's K={k}")
    return x


def dense(x, w_dec) -> np.ndarray:
    """float64 [M, N] = x @ w_dec.T, both converted exactly to float64."""
    w = to_float64(w_dec)
    if w.ndim != 2:
        raise ValueError(f"w_dec: expected a matrix [N, K] (rank 2), got rank {w.ndim}")
    return _x64(x, w.shape[1]) @ w.T


def floating(x, weight, *, layout="raw", n=None, k=None, rows=None) -> np.ndarray:
    """The floating path's function: x against the decoded weights, in float64."""
    return dense(x, pq2.decode(weight, layout=layout, n=n, k=k, rows=rows))


def _operands(x, weight, rows, layout="raw", n=None, k=None):
    """Q8 of x (plain order) and the signed weight codes, both as float64 [.., G, 128]."""
    codes, scales = pq2.read(weight, layout=layout, n=n, k=k, rows=rows)
    n, k = codes.shape
    q8 = quantize_q8(x)   # from x's own dtype: Q8 converts to fp32 first, as the kernels do
    m, kx = q8.q.shape
    if kx != k:
        raise ValueError(f"x: K={kx} does not match the weight's K={k}")
    q = q8.q.astype(np.float64).reshape(m, k // GROUP, GROUP)
    c = codes.astype(np.float64).reshape(n, k // GROUP, GROUP) - 1.0
    return q, q8.scales.astype(np.float64), c, scales.astype(np.float64)


def group_dots(x, weight, *, layout="raw", n=None, k=None, rows=None) -> np.ndarray:
    """int64 [M, N, G]: dot_g(q[m], codes[n] - 1) for each 128-group g, exact.
    Computed by a float64 matmul: every partial sum is an integer of at most 127*128 < 2**53,
    so it is exact in any summation order."""
    q, _, c, _ = _operands(x, weight, rows, layout, n, k)
    dots = np.matmul(q.transpose(1, 0, 2), c.transpose(1, 2, 0))   # [G, M, N]
    return dots.transpose(1, 2, 0).astype(np.int64)


def quantized(x, weight, *, layout="raw", n=None, k=None, rows=None) -> np.ndarray:
    """The integer paths' function in float64: y[m, n] = sum_g dot_g * xs[m, g] * ws[n, g],
    groups summed in order 0..G-1 (exact integer dots as in group_dots)."""
    q, xs, c, ws = _operands(x, weight, rows, layout, n, k)
    y = np.zeros((q.shape[0], c.shape[0]))
    for g in range(q.shape[1]):   # a loop over groups (K/128), not rows: each step is a matmul
        y += (q[:, g, :] @ c[:, g, :].T) * xs[:, g, None] * ws[None, :, g]
    return y
