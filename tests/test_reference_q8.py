"""reference.q8: the exact FP32 Q8 quantizer, against the naive reading and as properties."""
from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st
from hypothesis.extra import numpy as hnp

from reference import generate, q8
from reference.metrics import bitwise_equal
from test_reference_naive import fp32_nearest, naive_inv127, naive_q8

SETTINGS = settings(max_examples=100, deadline=None)
TINY = np.finfo(np.float32).tiny           # smallest normal fp32
DTYPES = [torch.bfloat16, torch.float16, torch.float32]


@st.composite
def fp32_rows(draw, max_m=3, max_g=2, max_abs=2.0 ** 100):
    """fp32 [M, G*128]: any finite value up to max_abs (subnormals, both zeros), some groups
    all zero, at random scales."""
    m = draw(st.integers(1, max_m))
    g = draw(st.integers(1, max_g))
    x = draw(hnp.arrays(np.float32, (m, g * 128),
                        elements=st.floats(-max_abs, max_abs, width=32, allow_nan=False)))
    zero = draw(hnp.arrays(np.bool_, (m, g)))
    x.reshape(m, g, 128)[zero] = 0
    return x


@st.composite
def seeded_rows(draw):
    """Realistic activations from the generator, any kind and dtype, scaled by 2^e."""
    kind = draw(st.sampled_from(generate.KINDS))
    dtype = draw(st.sampled_from(DTYPES))
    x = generate.activations(draw(st.integers(1, 3)), 128 * draw(st.integers(1, 3)),
                             draw(st.integers(0, 2 ** 32 - 1)), kind, dtype)
    return x * 2.0 ** draw(st.integers(-20, 20)) if dtype == torch.float32 else x


def assert_matches_naive(x, order):
    got = q8.quantize_q8(x, order=order)
    q, s, t = naive_q8(x, order)
    assert got.q.dtype == np.int8 and got.scales.dtype == np.float32 and got.sums.dtype == np.int32
    assert got.q.tolist() == q
    assert bitwise_equal(got.scales, np.array(s, dtype=np.float32).reshape(got.scales.shape))
    assert got.sums.tolist() == t


# --- the constant and the arithmetic premise ----------------------------------------------
def test_inv127_is_correctly_rounded():
    assert Fraction(float(q8.INV127)) == naive_inv127()


@settings(max_examples=50, deadline=None)
@given(hnp.arrays(np.float32, 32, elements=st.floats(-2.0 ** 40, 2.0 ** 40, width=32, allow_nan=False)),
       hnp.arrays(np.float32, 32, elements=st.floats(2.0 ** -40, 2.0 ** 40, width=32)))
def test_numpy_fp32_multiply_and_divide_are_correctly_rounded(a, s):
    # the premise of the reference: numpy float32 ops round exactly once (checked with rationals)
    for x, y in zip(a.tolist(), s.tolist()):
        assert Fraction(float(np.float32(x) / np.float32(y))) == fp32_nearest(Fraction(x) / Fraction(y))
        assert Fraction(float(np.float32(y) * q8.INV127)) == fp32_nearest(Fraction(y) * naive_inv127())


# --- against the naive reading ----------------------------------------------------------------
@SETTINGS
@given(fp32_rows(), st.sampled_from(q8.ORDERS))
def test_matches_naive_on_edge_values(x, order):
    assert_matches_naive(x, order)


@SETTINGS
@given(seeded_rows(), st.sampled_from(q8.ORDERS))
def test_matches_naive_on_realistic_values(x, order):
    assert_matches_naive(x, order)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", generate.KINDS)
def test_input_types_agree(kind, dtype):
    x = generate.activations(2, 256, 7, kind, dtype)
    ref = q8.quantize_q8(x.float().numpy())
    for same in (x, x.float(), x.double(), x.float().numpy().astype(np.float64)):
        got = q8.quantize_q8(same)
        assert np.array_equal(got.q, ref.q) and bitwise_equal(got.scales, ref.scales)
    if dtype == torch.float16:
        assert np.array_equal(q8.quantize_q8(x.numpy()).q, ref.q)


def test_float64_input_is_rounded_to_fp32_first():
    x = np.zeros((1, 128))
    x[0, 0] = 127.0
    x[0, 1] = 0.5 + 2.0 ** -30          # rounds to 0.5 in fp32: a tie, to even 0
    assert q8.quantize_q8(x).q[0, 1] == 0
    x[0, 1] = 0.5 + 2.0 ** -20          # survives in fp32: rounds up
    assert q8.quantize_q8(x).q[0, 1] == 1


# --- invariants -----------------------------------------------------------------------------
@SETTINGS
@given(fp32_rows())
def test_invariants(x):
    r = q8.quantize_q8(x)
    m, k = x.shape
    q = r.q.astype(np.int64).reshape(m, k // 128, 128)
    groups = x.reshape(m, k // 128, 128)
    assert np.abs(q).max() <= 127
    assert np.array_equal(r.sums, q.sum(-1))
    amax = np.abs(groups).max(-1)
    zero = amax == 0
    assert (r.scales[zero] == 0).all() and (q[zero] == 0).all()
    # the largest magnitude maps to +-127 whenever the scale is a normal number (a subnormal
    # scale is too coarse for that; the spec keeps it anyway, and so does the reference)
    normal = r.scales >= TINY
    top = np.abs(groups).argmax(-1)
    qtop = np.take_along_axis(q, top[..., None], -1)[..., 0]
    xtop = np.take_along_axis(groups, top[..., None], -1)[..., 0]
    assert (np.abs(qtop[normal]) == 127).all()
    assert (np.sign(qtop[normal]) == np.sign(xtop[normal])).all()


@SETTINGS
@given(fp32_rows())
def test_requantize_dequantized_is_stable(x):
    r = q8.quantize_q8(x)
    m, k = x.shape
    deq = (r.q.reshape(m, k // 128, 128).astype(np.float32) * r.scales[:, :, None]).astype(np.float32)
    again = q8.quantize_q8(deq.reshape(m, k))
    normal_or_zero = np.repeat((r.scales >= TINY) | (r.scales == 0), 128, axis=1)
    assert np.array_equal(again.q[normal_or_zero], r.q[normal_or_zero])


@SETTINGS
@given(fp32_rows())
def test_plane_is_a_permutation_within_groups(x):
    plain = q8.quantize_q8(x, order="plain")
    plane = q8.quantize_q8(x, order="plane")
    m, k = x.shape
    assert bitwise_equal(plain.scales, plane.scales)
    assert np.array_equal(plain.sums, plane.sums)
    assert np.array_equal(np.sort(plain.q.reshape(m, -1, 128), -1), np.sort(plane.q.reshape(m, -1, 128), -1))
    assert np.array_equal(plane.sums, plane.q.reshape(m, -1, 128).astype(np.int64).sum(-1))
    assert np.array_equal(q8.from_plane(plane.q), plain.q)
    assert np.array_equal(q8.to_plane(plain.q), plane.q)
    for b, s in ((0, 0), (0, 3), (31, 0), (5, 2), (31, 3)):       # element 4b+s sits at s*32+b
        assert np.array_equal(plane.q[:, s * 32 + b::128], plain.q[:, 4 * b + s::128])


def test_ties_go_to_even():
    x = generate.activations(4, 512, 3, "ties", torch.bfloat16)
    r = q8.quantize_q8(x)
    x32 = x.float().numpy().reshape(4, 4, 128)
    quot = (x32 / r.scales[:, :, None]).astype(np.float32).astype(np.float64)
    tie = quot - np.floor(quot) == 0.5
    assert tie.sum() > 500                                  # the generator makes many ties
    q = r.q.reshape(4, 4, 128)
    assert (q[tie] % 2 == 0).all()
    assert (np.abs(q[tie] - quot[tie]) == 0.5).all()
    assert q8.quantize_q8(np.array([[127.0, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 126.5] + [0] * 120],
                                   np.float32)).q[0, :8].tolist() == [127, 0, 2, 2, 0, -2, -2, 126]


def test_zero_group_and_negative_zero():
    x = np.zeros((2, 256), np.float32)
    x[0, :128] = -0.0
    x[1, 128:] = 3.0
    r = q8.quantize_q8(x)
    assert r.scales.tolist() == [[0.0, 0.0], [0.0, np.float32(3.0) * q8.INV127]]
    assert (r.q[0] == 0).all() and (r.q[1, :128] == 0).all() and (r.q[1, 128:] == 127).all()
    assert r.sums.tolist() == [[0, 0], [0, 127 * 128]]


def test_scale_underflow_divides_by_one():
    # amax of 3 smallest subnormals: amax/127 rounds to 0, so the group divides by 1 (all q 0)
    x = np.zeros((1, 128), np.float32)
    x[0, 0] = np.float32(3 * 2.0 ** -149)
    r = q8.quantize_q8(x)
    assert r.scales[0, 0] == 0 and (r.q == 0).all()
    assert_matches_naive(x, "plain")


def test_subnormal_scale_is_kept_and_clipped():
    # amax 190 * 2^-149: the scale rounds to 2^-149 (no flush to zero), 190 clips to 127
    x = np.zeros((1, 128), np.float32)
    x[0, :3] = np.float32(2.0 ** -149) * np.array([190, -5, 64], np.float32)
    r = q8.quantize_q8(x)
    assert r.scales[0, 0] == np.float32(2.0 ** -149)
    assert r.q[0, :3].tolist() == [127, -5, 64]
    assert_matches_naive(x, "plane")


def test_dequantize():
    x = generate.activations(3, 384, 5, "normal", torch.float16)
    for order in q8.ORDERS:
        r = q8.quantize_q8(x, order=order)
        deq = q8.dequantize_q8(r, order=order)
        plain = q8.quantize_q8(x)
        want = plain.q.reshape(3, 3, 128).astype(np.float64) * plain.scales[:, :, None].astype(np.float64)
        assert bitwise_equal(deq, want.reshape(3, 384))
    # group 128 reconstruction error of normal activations is about half a percent (SPEC §7)
    err = np.linalg.norm(deq - x.double().numpy()) / np.linalg.norm(x.double().numpy())
    assert 0.001 < err < 0.02


# --- errors -----------------------------------------------------------------------------------
def test_rejects_bad_inputs():
    with pytest.raises(ValueError, match="K=100.*128"):
        q8.quantize_q8(np.zeros((1, 100), np.float32))
    with pytest.raises(ValueError, match="rank 1"):
        q8.quantize_q8(np.zeros(128, np.float32))
    with pytest.raises(TypeError, match="int8"):
        q8.quantize_q8(np.zeros((1, 128), np.int8))
    with pytest.raises(ValueError, match="order"):
        q8.quantize_q8(np.zeros((1, 128), np.float32), order="planes")
    x = np.zeros((2, 256), np.float32)
    x[1, 130] = np.nan
    with pytest.raises(ValueError, match="non-finite.*row 1, group 1"):
        q8.quantize_q8(x)
