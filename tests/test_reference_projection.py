"""reference.projection: the float64 functions of the paths, against naive loops."""
import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from kernels.format import PQ2Weight
from reference import generate, hadamard, pq2, projection, q8
from reference.metrics import relative_rms
from test_reference_naive import naive_decode, naive_group_dots, naive_quantized

SETTINGS = settings(max_examples=60, deadline=None)


@st.composite
def case(draw):
    m = draw(st.integers(1, 3))
    n = draw(st.integers(1, 4))
    k = 128 * draw(st.integers(1, 3))
    seed = draw(st.integers(0, 2 ** 32 - 1))
    kind = draw(st.sampled_from(generate.KINDS))
    dtype = draw(st.sampled_from([torch.bfloat16, torch.float16]))
    return generate.activations(m, k, seed, kind, dtype), generate.ternary_weight(n, k, seed + 1)


def close(a, b, rel=1e-12):
    """Elementwise within rel of the largest magnitude (a column can cancel to near zero)."""
    return np.abs(a - b).max() <= rel * max(np.abs(b).max(), 1e-300)


@SETTINGS
@given(case())
def test_quantized_matches_naive(c):
    x, raw = c
    y = projection.quantized(x, raw)
    assert y.dtype == np.float64 and y.shape == (x.shape[0], raw.shape[0])
    assert close(y, naive_quantized(x, raw))


@SETTINGS
@given(case())
def test_group_dots_exact_and_unsigned_codes_trick(c):
    x, raw = c
    dots = projection.group_dots(x, raw)
    assert dots.dtype == np.int64
    assert np.array_equal(dots, naive_group_dots(x, raw))
    # sum (c-1)*q == sum c*q - sum q, the unsigned-codes kernels' identity
    r = q8.quantize_q8(x)
    codes, _ = pq2.split_raw(raw)
    m, k = r.q.shape
    qg = r.q.astype(np.int64).reshape(m, 1, k // 128, 128)
    cg = codes.astype(np.int64).reshape(1, -1, k // 128, 128)
    assert np.array_equal((qg * cg).sum(-1) - r.sums[:, None, :], dots)


@SETTINGS
@given(case())
def test_quantized_is_the_scaled_sum_of_group_dots(c):
    x, raw = c
    dots = projection.group_dots(x, raw)
    xs = q8.quantize_q8(x).scales.astype(np.float64)
    _, ws = pq2.split_raw(raw)
    want = (dots * xs[:, None, :] * ws.astype(np.float64)[None, :, :]).sum(-1)
    assert close(projection.quantized(x, raw), want)


@SETTINGS
@given(case())
def test_floating_matches_naive(c):
    x, raw = c
    want = x.double().numpy() @ naive_decode(raw).T
    assert close(projection.floating(x, raw), want)
    assert close(projection.dense(x, naive_decode(raw)), want)


def test_all_weight_forms_agree():
    x = generate.activations(3, 512, 0)
    raw = generate.ternary_weight(7, 512, 1)
    wr = PQ2Weight.from_raw(torch.from_numpy(raw))
    wp = wr.to_prepared()
    forms = [(torch.from_numpy(raw), {}), (wr.data, dict(layout="raw", n=7, k=512)),
             (wp.data, dict(layout="prepared", n=7, k=512)), (wp.data.numpy(), dict(layout="prepared", n=7, k=512))]
    for f in (projection.quantized, projection.floating, projection.group_dots):
        ref = f(x, raw)
        for w, kw in forms:
            assert np.array_equal(f(x, w, **kw), ref), (f.__name__, kw)
    with pytest.raises(TypeError, match=r"^weight: expected the packed bytes .* pass w\.data, layout=w\.layout"):
        projection.quantized(x, wp)     # the runtime's class: the oracle reads bytes only


def test_rows_sample_columns():
    x = generate.activations(4, 640, 2, "outliers")
    raw = generate.ternary_weight(33, 640, 3)
    w = PQ2Weight.from_raw(torch.from_numpy(raw)).to_prepared()
    rows = np.array([32, 0, 7, 7, 19])
    wb = dict(layout=w.layout, n=w.n, k=w.k)
    assert np.array_equal(projection.quantized(x, w.data, **wb, rows=rows), projection.quantized(x, raw)[:, rows])
    assert np.array_equal(projection.group_dots(x, raw, rows=torch.tensor(rows)),
                          projection.group_dots(x, raw)[:, rows])
    assert close(projection.floating(x, w.data, **wb, rows=list(rows)), projection.floating(x, raw)[:, rows], 1e-14)
    with pytest.raises(IndexError, match="rows"):
        projection.quantized(x, raw, rows=[33])


def test_quantized_close_to_floating_as_in_the_spec():
    # Q8 group-128 error on normal activations: relative RMS about half a percent (SPEC §7)
    x = generate.activations(8, 1024, 4)
    raw = generate.ternary_weight(64, 1024, 5)
    err = relative_rms(projection.quantized(x, raw), projection.floating(x, raw))
    assert 1e-4 < err < 0.02


def test_rotation_cancels_in_dense():
    # orthogonal rotation of both x and decoded weights leaves x @ W.T unchanged
    x = generate.activations(2, 2048, 6).double().numpy()
    w = pq2.decode(generate.ternary_weight(5, 2048, 7))
    s = hadamard.random_signs(1024, 8)
    rot = projection.dense(hadamard.rotate(x, s), hadamard.rotate(w, s))
    assert close(rot, projection.dense(x, w), 1e-12)


def test_zero_groups_contribute_nothing():
    x = generate.activations(2, 384, 9, "zero_groups")
    raw = generate.ternary_weight(3, 384, 10)
    dots = projection.group_dots(x, raw)
    zero = (x.float().numpy().reshape(2, 3, 128) == 0).all(-1)
    assert zero.any() and (dots[zero[:, None, :].repeat(3, 1)] == 0).all()


def test_errors():
    x = generate.activations(2, 256, 0)
    raw = generate.ternary_weight(3, 384, 0)
    with pytest.raises(ValueError, match="K=256.*K=384"):
        projection.quantized(x, raw)
    with pytest.raises(ValueError, match="K=256.*K=384"):
        projection.floating(x, raw)
    bad = raw.copy()
    bad[2, 34 + 2] = 0xFF
    with pytest.raises(pq2.PQ2FormatError, match="code 3 at row 2, block 1"):
        projection.quantized(generate.activations(2, 384, 0), bad)
    with pytest.raises(ValueError, match="rank"):
        projection.dense(np.zeros(4), np.zeros((2, 4)))
