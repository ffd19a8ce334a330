"""A second, deliberately naive reading of the spec, written apart from reference/: Python loops,
bytes twiddled by hand, struct for fp16, numpy float32 scalars for the FP32 arithmetic.
The other test_reference_* files cross-check reference/ against these; the tests here check
the naive code itself on hand-made examples."""
import math
import struct
from fractions import Fraction

import numpy as np

BLOCK_BYTES = 34


# --- PQ2_0 ----------------------------------------------------------------------------------
def naive_blocks(raw):
    """raw uint8 [N, RS] -> per row, a list of (scale as Python float, list of 128 codes)."""
    rows = []
    for r in range(raw.shape[0]):
        row = bytes(raw[r].tolist())
        blocks = []
        for start in range(0, len(row), BLOCK_BYTES):
            scale = struct.unpack("<e", row[start:start + 2])[0]
            codes = []
            for b in range(32):
                byte = row[start + 2 + b]
                for s in range(4):
                    codes.append((byte >> (2 * s)) & 3)   # weight 4*b + s
            blocks.append((scale, codes))
        rows.append(blocks)
    return rows


def naive_decode(raw):
    """raw -> float64 [N, K], weight = (code - 1) * scale."""
    out = []
    for blocks in naive_blocks(raw):
        row = []
        for scale, codes in blocks:
            row.extend((c - 1) * scale for c in codes)
        out.append(row)
    return np.array(out, dtype=np.float64)


def naive_decode_prepared(flat, n, k):
    """prepared flat buffer -> float64 [N, K], reading both planes byte by byte."""
    data = bytes(np.asarray(flat).tolist())
    g = k // 128
    code_plane = n * k // 4
    out = np.zeros((n, k))
    for r in range(n):
        for blk in range(g):
            at = code_plane + 2 * (r * g + blk)
            scale = struct.unpack("<e", data[at:at + 2])[0]
            for b in range(32):
                byte = data[r * (k // 4) + blk * 32 + b]
                for s in range(4):
                    out[r, blk * 128 + 4 * b + s] = (((byte >> (2 * s)) & 3) - 1) * scale
    return out


def naive_encode(codes, scales):
    """codes [N, K] ints, scales [N, G] fp16 -> raw uint8 [N, G*34], built with struct and ORs."""
    n, k = len(codes), len(codes[0])
    out = []
    for r in range(n):
        row = bytearray()
        for blk in range(k // 128):
            row += struct.pack("<e", float(scales[r][blk]))
            for b in range(32):
                byte = 0
                for s in range(4):
                    byte |= int(codes[r][blk * 128 + 4 * b + s]) << (2 * s)
                row.append(byte)
        out.append(list(row))
    return np.array(out, dtype=np.uint8).reshape(n, (k // 128) * BLOCK_BYTES)


# --- Q8 -------------------------------------------------------------------------------------
def fp32_nearest(x: Fraction) -> Fraction:
    """x rounded to the nearest fp32 (ties to even), with exact rationals; finite range only."""
    if x == 0:
        return Fraction(0)
    sign = -1 if x < 0 else 1
    m = abs(x)
    e = math.floor(math.log2(m))      # may be off by one; fixed below
    while Fraction(2) ** e > m:
        e -= 1
    while Fraction(2) ** (e + 1) <= m:
        e += 1
    ulp = Fraction(2) ** (max(e, -126) - 23)   # subnormals share the ulp 2**-149
    steps = m / ulp
    low = math.floor(steps)
    rest = steps - low
    if rest > Fraction(1, 2) or (rest == Fraction(1, 2) and low % 2 == 1):
        low += 1
    return sign * low * ulp


def round_half_even(f: float) -> int:
    low = math.floor(f)
    rest = f - low
    if rest > 0.5:
        return low + 1
    if rest < 0.5:
        return low
    return low if low % 2 == 0 else low + 1


def naive_inv127():
    """fp32(1/127), correctly rounded, without numpy."""
    return fp32_nearest(Fraction(1, 127))


def naive_q8(x, order="plain"):
    """x: anything with .tolist() giving rows of Python floats (fp32-representable, or rounded
    to fp32 here). Returns (q list of rows, scales list of rows (np.float32), sums list of rows)."""
    inv = np.float32(float(naive_inv127()))
    qs, scales, sums = [], [], []
    for row in x.tolist():
        qrow, srow, trow = [], [], []
        for start in range(0, len(row), 128):
            vals = [np.float32(v) for v in row[start:start + 128]]
            amax = np.float32(0)
            for v in vals:
                if abs(v) > amax:
                    amax = abs(v)
            scale = np.float32(amax * inv)           # float32 scalar product: one rounding
            div = scale if scale != 0 else np.float32(1)
            group = []
            for v in vals:
                quot = np.float32(v / div)          # float32 scalar division
                group.append(max(-127, min(127, round_half_even(float(quot)))))
            if order == "plane":
                planed = [0] * 128
                for b in range(32):
                    for s in range(4):
                        planed[s * 32 + b] = group[4 * b + s]
                group = planed
            qrow.extend(group)
            srow.append(scale)
            trow.append(sum(group))
        qs.append(qrow)
        scales.append(srow)
        sums.append(trow)
    return qs, scales, sums


def naive_quantized(x, raw):
    """y[m][n] = sum_g dot_g(q[m], codes[n] - 1) * xs[m][g] * ws[n][g] in Python floats."""
    q, xs, _ = naive_q8(x)
    w = naive_blocks(raw)
    y = []
    for m in range(len(q)):
        yrow = []
        for blocks in w:
            acc = 0.0
            for g, (ws, codes) in enumerate(blocks):
                dot = sum(q[m][g * 128 + i] * (codes[i] - 1) for i in range(128))
                acc += dot * float(xs[m][g]) * ws
            yrow.append(acc)
        y.append(yrow)
    return np.array(y)


def naive_group_dots(x, raw):
    q, _, _ = naive_q8(x)
    w = naive_blocks(raw)
    return np.array([[[sum(q[m][g * 128 + i] * (codes[i] - 1) for i in range(128))
                       for g, (_, codes) in enumerate(blocks)] for blocks in w]
                     for m in range(len(q))], dtype=np.int64)


# --- checks of the naive code itself ----------------------------------------------------------
def _one_block(scale_bytes, code_bytes):
    return np.array([list(scale_bytes) + list(code_bytes)], dtype=np.uint8)


def test_naive_decode_hand_block():
    # scale 0.5 is fp16 0x3800, little-endian 00 38; byte 0x92 = 0b10_01_00_10 holds codes
    # s0=2, s1=0, s2=1, s3=2 -> weights +1, -1, 0, +1
    raw = _one_block([0x00, 0x38], [0x92] + [0x55] * 31)
    w = naive_decode(raw)[0]
    assert list(w[:4]) == [0.5, -0.5, 0.0, 0.5]
    assert all(v == 0.0 for v in w[4:])                  # 0x55 = four codes 1


def test_naive_encode_hand_block():
    codes = [[2, 0, 1, 2] + [1] * 124]
    raw = naive_encode(codes, [[np.float16(0.5)]])
    assert raw[0, :3].tolist() == [0x00, 0x38, 0x92]
    assert raw[0, 3:].tolist() == [0x55] * 31


def test_naive_prepared_hand_block():
    raw = _one_block([0x00, 0xBC], [0x06] + [0x55] * 31)      # scale -1.0; codes 2,1,0,0
    flat = np.array([0x06] + [0x55] * 31 + [0x00, 0xBC], dtype=np.uint8)
    assert naive_decode_prepared(flat, 1, 128)[0, :4].tolist() == [-1.0, 0.0, 1.0, 1.0]
    assert np.array_equal(naive_decode(raw), naive_decode_prepared(flat, 1, 128))


def test_naive_rounding():
    assert [round_half_even(v) for v in (0.5, 1.5, 2.5, -0.5, -1.5, 2.4999, 2.5001)] == \
        [0, 2, 2, 0, -2, 2, 3]
    assert fp32_nearest(Fraction(1, 3)) == Fraction(float(np.float32(1 / 3)))
    assert fp32_nearest(Fraction(1, 2 ** 150)) == 0                 # half the smallest: even
    assert fp32_nearest(Fraction(3, 2 ** 150)) == Fraction(2, 2 ** 149)   # 1.5 ulp -> 2


def test_naive_q8_hand_group():
    x = np.zeros((1, 128), dtype=np.float32)
    x[0, :4] = [127.0, 0.5, 1.5, -2.5]       # scale 1.0 exactly, three ties
    q, s, t = naive_q8(x)
    assert float(s[0][0]) == 1.0
    assert q[0][:4] == [127, 0, 2, -2]
    assert t[0][0] == 127
    qp, _, _ = naive_q8(x, "plane")
    assert qp[0][0] == 127 and qp[0][32] == 0 and qp[0][64] == 2 and qp[0][96] == -2
