"""Seeded test data (numpy.random.default_rng(seed)): realistic ternary weights and activations.

Weights draw codes from {0, 1, 2} (about a third each, never 3: uniform random bytes are not
realistic, SPEC §2) and positive normal fp16 scales, lognormal around 0.02.
"""
import numpy as np
import torch

from . import pq2
from .q8 import GROUP, INV127

KINDS = ("normal", "heavy", "outliers", "zero_groups", "ties")
OUTLIER_FACTOR = 50.0
_FP16_MIN_NORMAL = 2.0 ** -14
_FP16_MAX = 65504.0
_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_TIE_EXPONENTS = (-6, 4)   # 2^e scales whose ties and 127*2^e are normal in bf16 and fp16

__all__ = ["KINDS", "ternary_parts", "ternary_weight", "activations"]


def ternary_parts(n: int, k: int, seed: int, *, scale: float = 0.02, spread: float = 0.5):
    """(codes uint8 [N, K] in {0,1,2}, scales float16 [N, K/128]); scales lognormal around
    `scale` (sigma `spread`), clipped to the normal fp16 range: never 0, subnormal or Inf."""
    if k <= 0 or k % GROUP:
        raise ValueError(f"k: K={k} is not a positive multiple of {GROUP}")
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 3, size=(n, k), dtype=np.uint8)
    s = scale * np.exp(spread * rng.standard_normal((n, k // GROUP)))
    scales = np.clip(s, _FP16_MIN_NORMAL, _FP16_MAX).astype(np.float16)
    return codes, scales


def ternary_weight(n: int, k: int, seed: int, **kw) -> np.ndarray:
    """Raw PQ2_0 uint8 [N, K/128*34] (torch.from_numpy it for a PQ2Weight)."""
    return pq2.encode(*ternary_parts(n, k, seed, **kw))


def _ties(rng, m, k):
    """Per group, a power-of-two scale 2^e: one element +-127*2^e (so the fp32 scale is exactly
    2^e) and the rest mostly exact rounding ties (j + 0.5)*2^e, some integers j*2^e. Every value
    has at most 8 significant bits, so bf16, fp16 and fp32 hold it exactly."""
    g = k // GROUP
    e = rng.integers(_TIE_EXPONENTS[0], _TIE_EXPONENTS[1] + 1, size=(m, g, 1)).astype(np.float64)
    # why this works: fp32(127*2^e * fp32(1/127)) == 2^e; checked here for the exponents used
    for ee in range(_TIE_EXPONENTS[0], _TIE_EXPONENTS[1] + 1):
        assert np.float32(np.float32(127 * 2.0 ** ee) * INV127) == np.float32(2.0 ** ee)
    j = rng.integers(0, 127, size=(m, g, GROUP)).astype(np.float64)
    half = np.where(rng.random((m, g, GROUP)) < 0.75, 0.5, 0.0)
    sign = np.where(rng.random((m, g, GROUP)) < 0.5, -1.0, 1.0)
    x = sign * (j + half) * 2.0 ** e
    top = rng.integers(0, GROUP, size=(m, g))
    mi, gi = np.meshgrid(np.arange(m), np.arange(g), indexing="ij")
    x[mi, gi, top] = np.where(rng.random((m, g)) < 0.5, -127.0, 127.0) * 2.0 ** e[:, :, 0]
    return x.reshape(m, k)


def activations(m: int, k: int, seed: int, kind: str = "normal",
                dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """Activations [M, K] as a torch CPU tensor of `dtype` (bf16, fp16 or fp32).
    kinds: normal N(0,1); heavy (student-t, 3 degrees of freedom); outliers (a few columns
    50x); zero_groups (about a quarter of the (row, 128-group) pairs all zero, at least one);
    ties (exact rounding ties for the Q8 quantizer, see _ties)."""
    if kind not in KINDS:
        raise ValueError(f"kind: expected one of {KINDS}, got {kind!r}")
    if dtype not in _DTYPES:
        raise ValueError(f"dtype: expected one of {_DTYPES}, got {dtype}")
    if kind in ("zero_groups", "ties") and (k <= 0 or k % GROUP):
        raise ValueError(f"k: K={k} is not a positive multiple of {GROUP}")
    rng = np.random.default_rng(seed)
    if kind == "ties":
        x = _ties(rng, m, k)
        t = torch.from_numpy(x).to(dtype)
        assert np.array_equal(t.double().numpy(), x), "tie values must be exact in the dtype"
        return t
    if kind == "heavy":
        x = rng.standard_t(3, size=(m, k))
    else:
        x = rng.standard_normal((m, k))
    if kind == "outliers":
        cols = rng.choice(k, size=max(1, k // 512), replace=False)
        x[:, cols] *= OUTLIER_FACTOR
    elif kind == "zero_groups":
        zero = rng.random((m, k // GROUP)) < 0.25
        if zero.size:
            zero.flat[rng.integers(zero.size)] = True
        x.reshape(m, k // GROUP, GROUP)[zero] = 0.0
    return torch.from_numpy(x).to(dtype)
