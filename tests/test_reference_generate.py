"""reference.generate: seeded, realistic, and each kind does what it says."""
import numpy as np
import pytest
import torch

from reference import generate, pq2, q8
from reference.metrics import bitwise_equal


def test_weights_seeded_and_realistic():
    raw = generate.ternary_weight(64, 1024, 0)
    assert raw.dtype == np.uint8 and raw.shape == (64, 8 * 34)
    assert np.array_equal(raw, generate.ternary_weight(64, 1024, 0))
    assert not np.array_equal(raw, generate.ternary_weight(64, 1024, 1))
    pq2.validate(raw)
    codes, scales = pq2.split_raw(raw)
    share = np.bincount(codes.ravel(), minlength=4) / codes.size
    assert share[3] == 0 and np.all(np.abs(share[:3] - 1 / 3) < 0.01)
    s = scales.astype(np.float64)
    assert (s >= 2.0 ** -14).all() and np.isfinite(s).all()        # positive, normal, finite
    assert 0.015 < np.median(s) < 0.025


def test_weight_parts_encode_to_the_weight():
    codes, scales = generate.ternary_parts(5, 256, 3)
    assert codes.dtype == np.uint8 and scales.dtype == np.float16
    assert np.array_equal(pq2.encode(codes, scales), generate.ternary_weight(5, 256, 3))
    tiny = generate.ternary_parts(4, 128, 0, scale=1e-9)[1]
    assert (tiny == np.float16(2.0 ** -14)).all()                   # clipped up, never subnormal


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("kind", generate.KINDS)
def test_activations_shape_dtype_seed(kind, dtype):
    x = generate.activations(3, 512, 11, kind, dtype)
    assert x.dtype == dtype and x.shape == (3, 512) and x.device.type == "cpu"
    assert torch.isfinite(x).all()
    assert bitwise_equal(x, generate.activations(3, 512, 11, kind, dtype))
    assert not bitwise_equal(x, generate.activations(3, 512, 12, kind, dtype))


def test_default_dtype_is_bf16():
    assert generate.activations(1, 128, 0).dtype == torch.bfloat16


def test_outliers():
    x = generate.activations(64, 1024, 0, "outliers").double().numpy()
    col = np.abs(x).mean(0)
    big = col > 10 * np.median(col)
    assert 1 <= big.sum() <= 8
    assert 20 < np.median(col[big]) / np.median(col) < 100


def test_zero_groups():
    x = generate.activations(8, 1024, 0, "zero_groups")
    zero = (x.reshape(8, 8, 128) == 0).all(-1)
    assert 0 < zero.float().mean() < 0.5
    r = q8.quantize_q8(x)
    assert (r.scales[zero.numpy()] == 0).all()
    assert zero.any() and generate.activations(1, 128, 5, "zero_groups").eq(0).all()  # at least one


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_ties_sit_exactly_on_ties(dtype):
    x = generate.activations(6, 512, 1, "ties", dtype)
    r = q8.quantize_q8(x)
    s = r.scales.astype(np.float64)
    assert np.array_equal(s, 2.0 ** np.round(np.log2(s)))           # every scale a power of two
    quot = x.double().numpy().reshape(6, 4, 128) / s[:, :, None]    # exact: power-of-two divide
    frac = quot - np.floor(quot)
    assert ((frac == 0.5) | (frac == 0)).all()
    assert 0.6 < (frac == 0.5).mean() < 0.9
    assert (np.abs(quot).max(-1) == 127).all()


def test_bad_arguments():
    with pytest.raises(ValueError, match="kind"):
        generate.activations(1, 128, 0, "uniform")
    with pytest.raises(ValueError, match="dtype"):
        generate.activations(1, 128, 0, dtype=torch.float64)
    with pytest.raises(ValueError, match="128"):
        generate.activations(1, 100, 0, "ties")
    with pytest.raises(ValueError, match="128"):
        generate.ternary_weight(1, 100, 0)
