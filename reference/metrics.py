"""Comparison metrics (SPEC §7, §8). NaN never passes: a non-finite value gives inf (relative_rms,
max_abs) or the largest distance (ulp_distance). Bitwise checks compare integer views, so -0.0
differs from 0.0 and NaN payloads count."""
import numpy as np

from . import to_float64

__all__ = ["relative_rms", "max_abs", "ulp_distance", "max_ulp", "bitwise_equal",
           "first_difference", "describe_difference", "FAR", "spacing", "round_once"]

FAR = np.iinfo(np.int64).max    # ulp distance reported for NaN or a mismatched infinity
_INT = {1: np.int8, 2: np.int16, 4: np.int32, 8: np.int64}
_ULP_DTYPES = ("bfloat16", "float16", "float32")


def _pair64(y, ref):
    y, ref = to_float64(y), to_float64(ref)
    if y.shape != ref.shape:
        raise ValueError(f"shapes differ: {y.shape} vs {ref.shape}")
    return y, ref


def relative_rms(y, ref) -> float:
    """||y - ref|| / ||ref|| in float64. inf if any value of y or ref is NaN or Inf (the float64
    reference is finite for sane inputs, so a non-finite value means something broke).
    An all-zero ref is matched only exactly: 0.0 if y is all zero too, else inf."""
    y, ref = _pair64(y, ref)
    if not (np.isfinite(y).all() and np.isfinite(ref).all()):
        return float("inf")
    err = float(np.linalg.norm((y - ref).ravel()))
    norm = float(np.linalg.norm(ref.ravel()))
    if norm == 0.0:
        return 0.0 if err == 0.0 else float("inf")
    return err / norm


def max_abs(y, ref) -> float:
    """max |y - ref| in float64; inf if any value is NaN or Inf; 0.0 for empty inputs."""
    y, ref = _pair64(y, ref)
    if not (np.isfinite(y).all() and np.isfinite(ref).all()):
        return float("inf")
    return float(np.abs(y - ref).max()) if y.size else 0.0


def _bits(a):
    """(integer view as numpy, dtype name) of a torch tensor or numpy array, any device."""
    try:
        import torch
        if isinstance(a, torch.Tensor):
            a = a.detach()
            name = str(a.dtype).replace("torch.", "")
            if a.dtype == torch.bool:
                a = a.to(torch.uint8)
            size = a.element_size()
            ints = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[size]
            return a.view(ints).cpu().numpy(), name
    except ImportError:  # pragma: no cover
        pass
    a = np.asarray(a)
    if a.dtype == np.bool_:
        return a.view(np.int8), "bool"
    return a.view(_INT[a.dtype.itemsize]), a.dtype.name


def _bits_pair(a, b):
    ba, na = _bits(a)
    bb, nb = _bits(b)
    if na != nb:
        raise TypeError(f"dtypes differ: {na} vs {nb}")
    if ba.shape != bb.shape:
        raise ValueError(f"shapes differ: {ba.shape} vs {bb.shape}")
    return ba, bb, na


def bitwise_equal(a, b) -> bool:
    """Same dtype, same shape and the same bits everywhere (False otherwise, never raises)."""
    try:
        ba, bb, _ = _bits_pair(a, b)
    except (TypeError, ValueError):
        return False
    return bool(np.array_equal(ba, bb))


def first_difference(a, b):
    """Index tuple of the first element (C order) whose bits differ, or None if bitwise equal.
    Raises TypeError / ValueError when dtypes / shapes differ."""
    ba, bb, _ = _bits_pair(a, b)
    neq = ba != bb
    if not neq.any():
        return None
    return tuple(int(i) for i in np.unravel_index(int(np.argmax(neq)), neq.shape))


def describe_difference(a, b) -> str:
    """A one-line account of how a and b differ bitwise, for failure messages."""
    try:
        ba, bb, name = _bits_pair(a, b)
    except (TypeError, ValueError) as e:
        return str(e)
    idx = first_difference(a, b)
    if idx is None:
        return f"bitwise equal ({name}, shape {ba.shape})"
    va, vb = float(to_float64(a)[idx]), float(to_float64(b)[idx])
    width = ba.dtype.itemsize * 2
    mask = (1 << (8 * ba.dtype.itemsize)) - 1
    return (f"{int((ba != bb).sum())} of {ba.size} {name} elements differ; first at {idx}: "
            f"{va!r} (0x{int(ba[idx]) & mask:0{width}x}) vs {vb!r} (0x{int(bb[idx]) & mask:0{width}x})")


def _ordinal(bits: np.ndarray) -> np.ndarray:
    """Map a float's signed-integer bits onto a monotone integer line (+0 and -0 both to 0):
    magnitude bits for positives, their negation for negatives."""
    b = bits.astype(np.int64)
    width = bits.dtype.itemsize * 8
    mag = b & ((1 << (width - 1)) - 1)
    return np.where(b < 0, -mag, mag)


def ulp_distance(y, ref) -> np.ndarray:
    """int64 array (y's shape): how many representable values lie between y and ref, for
    same-dtype bf16 / fp16 / fp32. +0 and -0 are 0 apart. NaN anywhere, or an infinity that is
    not the same infinity in the other, gives FAR."""
    by, br, name = _bits_pair(y, ref)
    if name not in _ULP_DTYPES:
        raise TypeError(f"ulp_distance: expected bfloat16, float16 or float32, got {name}")
    d = np.abs(_ordinal(by) - _ordinal(br))
    fy, fr = to_float64(y), to_float64(ref)
    far = np.isnan(fy) | np.isnan(fr) | ((np.isinf(fy) | np.isinf(fr)) & (by != br))
    return np.where(far, FAR, d)


def max_ulp(y, ref) -> int:
    """Largest ulp_distance (0 for empty inputs)."""
    d = ulp_distance(y, ref)
    return int(d.max()) if d.size else 0


# (significant bits p, smallest normal exponent emin, largest finite value) of each format
_FORMATS = {"bfloat16": (8, -126, float.fromhex("0x1.fep127")),
            "float16": (11, -14, 65504.0),
            "float32": (24, -126, float.fromhex("0x1.fffffep127"))}


def _format(dtype):
    name = str(dtype).replace("torch.", "")
    if name not in _FORMATS:
        raise TypeError(f"expected bfloat16, float16 or float32, got {name}")
    return _FORMATS[name]


def spacing(v, dtype) -> np.ndarray:
    """float64: the distance between adjacent values of `dtype` at magnitude |v| (the spacing of
    |v|'s binade; the subnormal spacing below the normal range). Exact powers of two."""
    p, emin, _ = _format(dtype)
    a = np.abs(np.asarray(v, dtype=np.float64))
    _, e = np.frexp(a)                    # |v| = f * 2**e, f in [0.5, 1); e = 0 for zero
    e = np.where(a < 2.0 ** emin, emin + 1, e)
    return np.ldexp(1.0, e - 1 - (p - 1))


def round_once(v, dtype) -> np.ndarray:
    """float64 v rounded to nearest, ties to even, onto `dtype` in ONE step (no float32 on the
    way, so no double rounding), returned as float64; +-inf past the overflow threshold, NaN
    stays NaN. v / spacing is exact (a power of two) and np.rint rounds half to even."""
    _, _, big = _format(dtype)
    v = np.asarray(v, dtype=np.float64)
    s = spacing(v, dtype)
    with np.errstate(invalid="ignore"):
        r = np.rint(v / s) * s
    return np.where(np.abs(r) > big, np.copysign(np.inf, v), r)
