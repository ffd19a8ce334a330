"""reference.metrics: NaN never passes; integer-view comparisons."""
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from reference import metrics

FINITE32 = st.floats(width=32, allow_nan=False, allow_infinity=False)


# --- relative_rms / max_abs ----------------------------------------------------------------
def test_relative_rms_values():
    ref = np.array([3.0, -4.0])
    assert metrics.relative_rms(ref, ref) == 0.0
    assert metrics.relative_rms(torch.tensor(ref), ref) == 0.0
    assert math.isclose(metrics.relative_rms(ref * 1.001, ref), 1e-3, rel_tol=1e-9)
    assert math.isclose(metrics.relative_rms(np.array([3.0, -3.0]), ref), 0.2, rel_tol=1e-12)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_never_passes(bad):
    ref = np.ones(5)
    y = ref.copy()
    y[3] = bad
    assert metrics.relative_rms(y, ref) == math.inf
    assert metrics.relative_rms(ref, y) == math.inf
    assert metrics.max_abs(y, ref) == math.inf
    assert not metrics.relative_rms(y, ref) <= 1e300                 # no tolerance lets it pass
    yt = torch.ones(5, dtype=torch.bfloat16)
    yt[0] = bad
    assert metrics.relative_rms(yt, ref) == math.inf


def test_zero_reference():
    z = np.zeros(4)
    assert metrics.relative_rms(z, z) == 0.0
    assert metrics.relative_rms(np.array([0, 0, 1e-30, 0]), z) == math.inf
    assert metrics.relative_rms(np.array([]), np.array([])) == 0.0
    assert metrics.max_abs(np.array([]), np.array([])) == 0.0


def test_max_abs_and_shapes():
    assert metrics.max_abs(np.array([1.0, 2.0, 3.5]), np.array([1.0, 2.5, 3.0])) == 0.5
    with pytest.raises(ValueError, match="shapes"):
        metrics.relative_rms(np.ones(3), np.ones(4))
    with pytest.raises(ValueError, match="shapes"):
        metrics.max_abs(np.ones((3, 1)), np.ones(3))


# --- ulp_distance -------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_ulp_adjacent_numpy(dtype):
    vals = np.array([0.0, 1.0, -1.0, 3.14, 6e-5, np.finfo(dtype).tiny, -1000.0], dtype)
    up = np.nextafter(vals, np.array(np.inf, dtype))
    assert metrics.ulp_distance(vals, up).tolist() == [1] * len(vals)
    assert metrics.ulp_distance(up, vals).tolist() == [1] * len(vals)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_ulp_adjacent_torch(dtype):
    x = torch.tensor([1.0, -2.5, 1e-3, 100.0], dtype=dtype)
    ints = {2: torch.int16, 4: torch.int32}[x.element_size()]
    away = (x.view(ints) + 1).view(dtype)          # one step away from zero
    assert metrics.ulp_distance(x, away).tolist() == [1, 1, 1, 1]
    assert metrics.max_ulp(x, away) == 1


def test_ulp_known_distances():
    f16 = np.float16
    assert metrics.max_ulp(np.array([1.0], f16), np.array([2.0], f16)) == 1024      # 10-bit mantissa
    tiny = np.array([2.0 ** -24], f16)                                             # smallest subnormal
    assert metrics.max_ulp(tiny, -tiny) == 2                                       # across zero
    assert metrics.max_ulp(np.array([0.0], f16), np.array([-0.0], f16)) == 0
    assert metrics.max_ulp(np.array([1.0], np.float32), np.array([1.0], np.float32)) == 0


def test_ulp_non_finite():
    far = metrics.FAR
    a = np.array([np.nan, np.inf, np.inf, 65504.0, -np.inf], np.float16)
    b = np.array([np.nan, np.inf, 65504.0, np.inf, np.inf], np.float16)
    assert metrics.ulp_distance(a, b).tolist() == [far, 0, far, far, far]


def test_ulp_rejects_mixed_or_unsupported():
    with pytest.raises(TypeError, match="differ"):
        metrics.ulp_distance(np.ones(2, np.float16), np.ones(2, np.float32))
    with pytest.raises(TypeError, match="bfloat16, float16 or float32"):
        metrics.ulp_distance(np.ones(2), np.ones(2))


@settings(max_examples=200, deadline=None)
@given(FINITE32, FINITE32, FINITE32)
def test_ulp_is_a_distance_on_a_line(a, b, c):
    a, b, c = sorted([a, b, c])
    v = lambda t: np.array([t], np.float32)                                  # noqa: E731
    dab, dbc, dac = (metrics.max_ulp(v(p), v(q)) for p, q in ((a, b), (b, c), (a, c)))
    assert dac == dab + dbc
    assert (dab == 0) == (a == b)
    assert metrics.max_ulp(v(b), v(a)) == dab


# --- bitwise ------------------------------------------------------------------------------------
def test_bitwise_equal():
    assert metrics.bitwise_equal(np.array([0.0, 1.0]), np.array([0.0, 1.0]))
    assert not metrics.bitwise_equal(np.array([0.0]), np.array([-0.0]))
    assert not metrics.bitwise_equal(torch.tensor([0.0], dtype=torch.bfloat16),
                                     torch.tensor([-0.0], dtype=torch.bfloat16))
    nan = np.array([np.nan], np.float32)
    assert metrics.bitwise_equal(nan, nan.copy())                 # same bits: equal, unlike ==
    other = (nan.view(np.int32) | 1).view(np.float32)             # another NaN payload
    assert not metrics.bitwise_equal(nan, other)
    assert not metrics.bitwise_equal(np.ones(2, np.float16), np.ones(2, np.float32))   # dtypes
    assert not metrics.bitwise_equal(np.ones(2), np.ones(3))                            # shapes
    assert metrics.bitwise_equal(torch.tensor([1.5, -2.0], dtype=torch.float16),
                                 np.array([1.5, -2.0], np.float16))
    assert metrics.bitwise_equal(torch.tensor([True, False]), torch.tensor([True, False]))
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    assert metrics.bitwise_equal(t.T, t.T.contiguous())


def test_first_difference_and_description():
    a = np.zeros((3, 4), np.float32)
    b = a.copy()
    assert metrics.first_difference(a, b) is None
    b[1, 2] = -0.0
    b[2, 0] = 5.0
    assert metrics.first_difference(a, b) == (1, 2)
    msg = metrics.describe_difference(a, b)
    assert "2 of 12" in msg and "(1, 2)" in msg and "0x80000000" in msg
    assert "bitwise equal" in metrics.describe_difference(a, a)
    assert "dtypes differ" in metrics.describe_difference(a, a.astype(np.float16))
    with pytest.raises(ValueError, match="shapes"):
        metrics.first_difference(a, a[:2])
    bf = torch.zeros(5, dtype=torch.bfloat16)
    bf2 = bf.clone()
    bf2[4] = 1
    assert metrics.first_difference(bf, bf2) == (4,)
