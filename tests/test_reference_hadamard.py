"""reference.hadamard: Sylvester matrix, rotation and its inverse."""
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from reference import hadamard

BLOCKS = [32, 64, 128, 256, 512, 1024]


@pytest.mark.parametrize("b", BLOCKS)
def test_sylvester_matrix(b):
    h = hadamard.hadamard_matrix(b)
    # an independent description of Sylvester's matrix: H[i, j] = (-1)^popcount(i & j)
    i, j = np.meshgrid(np.arange(b), np.arange(b), indexing="ij")
    parity = np.vectorize(lambda v: bin(v).count("1") % 2)(i & j)
    assert np.array_equal(h, np.where(parity == 1, -1.0, 1.0))
    assert np.array_equal(h @ h, b * np.eye(b))
    assert not h.flags.writeable


def test_rotate_matches_naive_per_element():
    b, k = 32, 96
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, k))
    signs = hadamard.random_signs(k, 1)
    y = hadamard.rotate(x, signs, block=b)
    for m in range(2):
        for blk in range(k // b):
            for i in range(b):
                want = sum((-1) ** bin(i & j).count("1") * x[m, blk * b + j] * signs[blk * b + j]
                           for j in range(b)) / math.sqrt(b)
                assert abs(y[m, blk * b + i] - want) <= 1e-14 * max(1.0, abs(want))


@settings(max_examples=50, deadline=None)
@given(st.sampled_from(BLOCKS), st.integers(1, 3), st.integers(1, 3), st.integers(0, 2 ** 32 - 1))
def test_round_trip_and_norm(b, m, nblk, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((m, b * nblk)) * 10.0 ** rng.integers(-3, 4)
    signs = hadamard.random_signs(b * nblk, seed)
    y = hadamard.rotate(x, signs, block=b)
    assert np.allclose(np.linalg.norm(y, axis=1), np.linalg.norm(x, axis=1), rtol=1e-13, atol=0)
    back = hadamard.unrotate(y, signs, block=b)
    assert np.abs(back - x).max() <= 1e-12 * np.abs(x).max()
    assert np.abs(hadamard.rotate(hadamard.unrotate(x, signs, b), signs, b) - x).max() <= 1e-12 * np.abs(x).max()


def test_block_signs_repeat_per_block():
    x = np.random.default_rng(2).standard_normal((3, 256))
    s = hadamard.random_signs(64, 3)
    assert np.array_equal(hadamard.rotate(x, s, 64), hadamard.rotate(x, np.tile(s, 4), 64))


def test_blocks_are_independent_and_row_shapes():
    x = np.random.default_rng(4).standard_normal((2, 2048))
    s = hadamard.random_signs(2048, 5)
    y = hadamard.rotate(x, s)
    y2 = np.concatenate([hadamard.rotate(x[:, :1024], s[:1024]),
                         hadamard.rotate(x[:, 1024:], s[1024:])], axis=1)
    assert np.allclose(y, y2, rtol=0, atol=1e-13)
    assert hadamard.rotate(x[0], s).shape == (2048,)                 # a single row works too


def test_torch_input_converted_exactly():
    x = torch.randn(2, 128).to(torch.bfloat16)
    s = hadamard.random_signs(128, 0)
    assert np.array_equal(hadamard.rotate(x, s, 128), hadamard.rotate(x.double().numpy(), s, 128))


def test_random_signs_seeded():
    a, b = hadamard.random_signs(1024, 7), hadamard.random_signs(1024, 7)
    assert np.array_equal(a, b) and a.dtype == np.float64
    assert set(np.unique(a)) == {-1.0, 1.0}
    assert not np.array_equal(a, hadamard.random_signs(1024, 8))
    assert 400 < (a > 0).sum() < 624


@pytest.mark.parametrize("block", [16, 48, 2048, 0, 1000])
def test_rejects_bad_block(block):
    with pytest.raises(ValueError, match="power of two"):
        hadamard.rotate(np.zeros((1, 4096)), np.ones(block or 1), block=block)


def test_rejects_k_not_multiple_of_block():
    with pytest.raises(ValueError, match="K=100.*block 32"):
        hadamard.rotate(np.zeros((1, 100)), np.ones(32), block=32)
    with pytest.raises(ValueError, match="K=96.*block 64"):
        hadamard.unrotate(np.zeros((1, 96)), np.ones(64), block=64)


def test_rejects_bad_signs():
    with pytest.raises(ValueError, match="signs"):
        hadamard.rotate(np.zeros((1, 128)), np.ones(100), block=64)
    with pytest.raises(ValueError, match=r"\+1 or -1"):
        hadamard.rotate(np.zeros((1, 64)), np.zeros(64), block=64)
