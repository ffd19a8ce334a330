"""PQ2_0 weight format (SPEC §2): encode, decode, raw <-> prepared, split, validate.

A block is 128 weights of one output row in 34 bytes: bytes 0-1 the fp16 scale (little-endian),
bytes 2-33 the codes; weight 4*b + s of the block is ((byte[b] >> 2s) & 3) - 1, times the scale.
Raw layout: uint8 [N, K/128*34]. Prepared layout: one flat uint8 buffer, the code plane
[N, K/4] (each row's code bytes, blocks in order) then the scale plane [N, K/128] fp16.

Everything here works on bytes (numpy or torch, any device) and returns numpy. It imports
nothing of the runtime (kernels/) or the suite: it is the oracle the runtime's own decoding is
checked against, so it takes the packed bytes and the layout facts (layout=, n=, k=) as plain
values, never the runtime's weight class. A runtime weight `w` is passed as
`w.data, layout=w.layout, n=w.n, k=w.k`.
"""
import numpy as np

from . import to_numpy

BLOCK = 128          # weights per block
BLOCK_BYTES = 34     # 2 scale bytes + 32 code bytes
CODE_BYTES = 32
_SHIFTS = np.array([0, 2, 4, 6], dtype=np.uint8)
# a byte's four codes as one 4-byte word: one gather per byte (4x faster than four shifts, and
# the FP64 references unpack every weight several times); the view keeps memory order
_WORDS = ((np.arange(256, dtype=np.uint8)[:, None] >> _SHIFTS) & 3).astype(np.uint8).view(np.uint32).ravel()


class PQ2FormatError(ValueError):
    """Bytes that are not valid PQ2_0 (dtype, rank, byte count, K, code 3, non-finite scale).
    The reference's own class (the runtime has another of the same name); both are ValueErrors."""

__all__ = ["BLOCK", "BLOCK_BYTES", "PQ2FormatError", "encode", "decode", "read", "validate",
           "raw_to_prepared", "prepared_to_raw", "split_raw", "split_prepared",
           "pack_codes", "unpack_codes"]


# --- bits <-> codes -------------------------------------------------------------------------
def unpack_codes(code_bytes: np.ndarray) -> np.ndarray:
    """uint8 [..., K/4] code bytes -> uint8 [..., K] codes 0..3; code 4*j + s = (byte[j] >> 2s) & 3."""
    cb = np.asarray(code_bytes, dtype=np.uint8)
    return _WORDS[cb].view(np.uint8).reshape(*cb.shape[:-1], cb.shape[-1] * 4)


def pack_codes(codes: np.ndarray) -> np.ndarray:
    """uint8 [..., K] codes 0..3 -> uint8 [..., K/4] code bytes (inverse of unpack_codes)."""
    c = np.asarray(codes, dtype=np.uint8)
    c = c.reshape(*c.shape[:-1], c.shape[-1] // 4, 4)
    return (c[..., 0] | (c[..., 1] << 2) | (c[..., 2] << 4) | (c[..., 3] << 6)).astype(np.uint8)


# --- structure checks (no data read) ----------------------------------------------------------
def _dtype_name(a) -> str:
    return str(a.dtype).replace("torch.", "")


def _as_array(w):
    """The bytes as given: a numpy array or torch tensor (left where it is: it may be large, on
    a GPU), or anything numpy reads as an array. An object that is neither (such as the
    runtime's weight class) is refused: the reference reads bytes, not another decoder's view."""
    if hasattr(w, "dtype") and hasattr(w, "shape"):
        return w
    if hasattr(w, "data") and hasattr(w, "layout"):
        raise TypeError(f"weight: expected the packed bytes (a uint8 numpy array or torch tensor), got "
                        f"{type(w).__name__}; pass w.data, layout=w.layout, n=w.n, k=w.k")
    return np.asarray(w)


def _check_shape(a, layout, n, k):
    """Check dtype, rank and byte counts; return (n, k)."""
    if _dtype_name(a) != "uint8":
        raise PQ2FormatError(f"weight: expected dtype uint8 (bytes), got {_dtype_name(a)}")
    if k is not None and (k <= 0 or k % BLOCK):
        raise PQ2FormatError(f"weight: K={k} is not a positive multiple of {BLOCK}")
    if layout == "raw":
        if len(a.shape) != 2:
            raise PQ2FormatError(
                f"weight: raw layout is a matrix [N, K/128*34] (rank 2), got rank {len(a.shape)}")
        rn, rs = a.shape
        if rs == 0 or rs % BLOCK_BYTES:
            raise PQ2FormatError(
                f"weight: raw row of {rs} bytes is not a positive multiple of {BLOCK_BYTES} "
                "(one block = 2 scale bytes + 32 code bytes)")
        rk = rs // BLOCK_BYTES * BLOCK
        if n is not None and n != rn:
            raise PQ2FormatError(f"weight: raw matrix has N={rn} rows, but n={n} was given")
        if k is not None and k != rk:
            raise PQ2FormatError(f"weight: raw rows of {rs} bytes hold K={rk}, but k={k} was given")
        return rn, rk
    if layout == "prepared":
        if n is None or k is None:
            raise PQ2FormatError("weight: the prepared layout needs n= and k=")
        if len(a.shape) != 1:
            raise PQ2FormatError(
                f"weight: prepared layout is ONE flat buffer (rank 1), got rank {len(a.shape)}")
        want = n * (k // BLOCK) * BLOCK_BYTES
        if a.shape[0] != want:
            raise PQ2FormatError(
                f"weight: prepared buffer has {a.shape[0]} bytes, expected N*K/128*34 = {want} "
                f"for N={n}, K={k}")
        return n, k
    raise ValueError(f"layout: expected 'raw' or 'prepared', got {layout!r}")


def _row_index(rows, n):
    if rows is None:
        return None
    idx = np.asarray(to_numpy(rows)).reshape(-1)
    if idx.dtype.kind not in "iu":
        raise TypeError(f"rows: expected integer indices, got dtype {idx.dtype}")
    idx = idx.astype(np.int64)
    if idx.size and (idx.min() < 0 or idx.max() >= n):
        raise IndexError(f"rows: indices must lie in [0, {n}), got min {idx.min()}, max {idx.max()}")
    return idx


def _take(a, idx):
    """Select rows of a numpy array or torch tensor (indexing on its own device), then numpy."""
    if idx is not None:
        if hasattr(a, "index_select"):
            import torch
            a = a.index_select(0, torch.as_tensor(idx, device=a.device))
        else:
            a = a[idx]
    return np.ascontiguousarray(to_numpy(a))


def _byte_planes(a, layout, n, k, idx):
    """(code bytes uint8 [R, K/4], scales float16 [R, G]) of the selected rows; no value checks."""
    g = k // BLOCK
    if layout == "raw":
        blocks = _take(a, idx).reshape(-1, g, BLOCK_BYTES)
        cb = blocks[:, :, 2:].reshape(-1, g * CODE_BYTES)
        sb = blocks[:, :, :2].reshape(-1, g * 2)
    else:
        cut = n * k // 4
        cb = _take(a[:cut].reshape(n, k // 4), idx)
        sb = _take(a[cut:].reshape(n, g * 2), idx)
    scales = np.ascontiguousarray(sb).view("<f2").astype(np.float16)
    return np.ascontiguousarray(cb), scales


def _check_values(codes, scales, idx):
    """Reject code 3 and non-finite scales, naming the first bad (original) row and block."""
    bad = codes == 3
    if bad.any():
        r, col = np.unravel_index(int(np.argmax(bad)), bad.shape)
        row = int(idx[r]) if idx is not None else int(r)
        raise PQ2FormatError(
            f"weight: code 3 at row {row}, block {col // BLOCK} (weight {col % BLOCK} of the block); "
            "PQ2_0 codes are 0, 1, 2 meaning -1, 0, +1")
    bad = ~np.isfinite(scales)
    if bad.any():
        r, blk = np.unravel_index(int(np.argmax(bad)), bad.shape)
        row = int(idx[r]) if idx is not None else int(r)
        raise PQ2FormatError(
            f"weight: non-finite fp16 scale {scales[r, blk]} at row {row}, block {blk}")


# --- public ---------------------------------------------------------------------------------
def read(w, *, layout="raw", n=None, k=None, rows=None):
    """Validated (codes uint8 [R, K] in {0,1,2}, scales float16 [R, G]) of the rows `rows`
    (all rows when None), from a raw matrix or a prepared flat buffer (n=, k=).
    Only the rows read are checked for code 3 and non-finite scales."""
    a = _as_array(w)
    n, k = _check_shape(a, layout, n, k)
    idx = _row_index(rows, n)
    cb, scales = _byte_planes(a, layout, n, k, idx)
    codes = unpack_codes(cb)
    _check_values(codes, scales, idx)
    return codes, scales


def validate(w, *, layout="raw", n=None, k=None):
    """Raise PQ2FormatError (a ValueError) naming what is wrong: dtype, rank, byte count,
    K not a multiple of 128, code 3 (first row and block), non-finite scale. Returns (n, k)."""
    codes, _ = read(w, layout=layout, n=n, k=k)
    return codes.shape[0], codes.shape[1]


def decode(w, *, layout="raw", n=None, k=None, rows=None) -> np.ndarray:
    """float64 [R, K] weights (code - 1) * scale; exact (fp16 times -1/0/+1)."""
    codes, scales = read(w, layout=layout, n=n, k=k, rows=rows)
    g = scales.shape[1]
    signed = codes.astype(np.float64).reshape(-1, g, BLOCK) - 1.0
    return (signed * scales.astype(np.float64)[:, :, None]).reshape(codes.shape)


def encode(codes, scales) -> np.ndarray:
    """codes [N, K] in {0,1,2} (any integer dtype, uint8 usual), scales float16 [N, K/128]
    -> raw uint8 [N, K/128*34]."""
    c = to_numpy(codes)
    s = to_numpy(scales)
    if c.dtype.kind not in "iu":
        raise PQ2FormatError(f"codes: expected an integer dtype (uint8), got {c.dtype}")
    if c.ndim != 2:
        raise PQ2FormatError(f"codes: expected a matrix [N, K] (rank 2), got rank {c.ndim}")
    n, k = c.shape
    if k == 0 or k % BLOCK:
        raise PQ2FormatError(f"codes: K={k} is not a positive multiple of {BLOCK}")
    bad = (c < 0) | (c > 2)
    if bad.any():
        r, col = np.unravel_index(int(np.argmax(bad)), bad.shape)
        raise PQ2FormatError(
            f"codes: code {c[r, col]} at row {r}, block {col // BLOCK}; PQ2_0 codes are 0, 1, 2")
    if s.dtype != np.float16:
        raise PQ2FormatError(f"scales: expected dtype float16, got {s.dtype}")
    if s.shape != (n, k // BLOCK):
        raise PQ2FormatError(f"scales: expected shape {(n, k // BLOCK)} = [N, K/128], got {s.shape}")
    bad = ~np.isfinite(s)
    if bad.any():
        r, blk = np.unravel_index(int(np.argmax(bad)), bad.shape)
        raise PQ2FormatError(f"scales: non-finite scale {s[r, blk]} at row {r}, block {blk}")
    g = k // BLOCK
    blocks = np.empty((n, g, BLOCK_BYTES), dtype=np.uint8)
    blocks[:, :, :2] = s.astype("<f2").view(np.uint8).reshape(n, g, 2)
    blocks[:, :, 2:] = pack_codes(c.astype(np.uint8)).reshape(n, g, CODE_BYTES)
    return blocks.reshape(n, g * BLOCK_BYTES)


def split_raw(raw):
    """raw [N, K/128*34] -> (codes uint8 [N, K] in 0..3, scales float16 [N, G]).
    Checks structure only (it is how one looks at a bad weight)."""
    a = _as_array(raw)
    n, k = _check_shape(a, "raw", None, None)
    cb, scales = _byte_planes(a, "raw", n, k, None)
    return unpack_codes(cb), scales


def split_prepared(flat, n, k):
    """prepared flat -> (code plane uint8 [N, K/4], scale plane float16 [N, G]). Structure only."""
    a = _as_array(flat)
    n, k = _check_shape(a, "prepared", n, k)
    return _byte_planes(a, "prepared", n, k, None)


def raw_to_prepared(raw) -> np.ndarray:
    """raw [N, RS] -> ONE flat uint8 buffer [N*RS]: code plane [N, K/4], then scales [N, G] fp16."""
    a = _as_array(raw)
    n, k = _check_shape(a, "raw", None, None)
    cb, scales = _byte_planes(a, "raw", n, k, None)
    return np.concatenate([cb.reshape(-1), scales.astype("<f2").view(np.uint8).reshape(-1)])


def prepared_to_raw(flat, n, k) -> np.ndarray:
    """prepared flat buffer -> raw uint8 [N, K/128*34]."""
    a = _as_array(flat)
    n, k = _check_shape(a, "prepared", n, k)
    cb, scales = _byte_planes(a, "prepared", n, k, None)
    g = k // BLOCK
    blocks = np.empty((n, g, BLOCK_BYTES), dtype=np.uint8)
    blocks[:, :, :2] = scales.astype("<f2").view(np.uint8).reshape(n, g, 2)
    blocks[:, :, 2:] = cb.reshape(n, g, CODE_BYTES)
    return blocks.reshape(n, g * BLOCK_BYTES)
