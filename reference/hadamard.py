"""Block Hadamard rotation in float64 (SPEC §4).

Per block of B consecutive elements of a row: y = H_B @ (x * signs) / sqrt(B), with H_B the
Sylvester Hadamard matrix (H_1 = [1], H_2n = [[H, H], [H, -H]]); the inverse is
x = (H_B @ y / sqrt(B)) * signs, since H_B is symmetric and H_B @ H_B = B * I.
An explicit matrix product rather than a fast transform: slower, but obviously the definition.
"""
import functools

import numpy as np

from . import to_float64, to_numpy

MIN_BLOCK, MAX_BLOCK = 32, 1024

__all__ = ["hadamard_matrix", "random_signs", "rotate", "unrotate"]


def _check_block(block):
    if not isinstance(block, (int, np.integer)) or isinstance(block, bool):
        raise TypeError(f"block: expected an int, got {type(block).__name__}")
    if block < MIN_BLOCK or block > MAX_BLOCK or block & (block - 1):
        raise ValueError(f"block: expected a power of two in [{MIN_BLOCK}, {MAX_BLOCK}], got {block}")


@functools.lru_cache(maxsize=None)
def _sylvester(b: int) -> np.ndarray:
    h = np.ones((1, 1))
    while h.shape[0] < b:
        h = np.block([[h, h], [h, -h]])
    h.flags.writeable = False
    return h


def hadamard_matrix(block: int) -> np.ndarray:
    """The Sylvester Hadamard matrix H_B (entries +-1, unnormalized), float64, read-only."""
    _check_block(block)
    return _sylvester(int(block))


def random_signs(n: int, seed: int) -> np.ndarray:
    """float64 [n] of +-1, seeded (numpy default_rng)."""
    rng = np.random.default_rng(seed)
    return np.where(rng.integers(0, 2, size=n) == 1, 1.0, -1.0)


def _prepare(x, signs, block):
    h = hadamard_matrix(block)
    x = to_float64(x)
    k = x.shape[-1] if x.ndim else 0
    if x.ndim == 0 or k % block:
        raise ValueError(f"rotation: K={k} is not a multiple of the block {block}")
    s = to_numpy(signs).astype(np.float64).reshape(-1)
    if s.size not in (block, k):
        raise ValueError(f"signs: expected {block} (one block, repeated) or K={k} values, got {s.size}")
    if not np.all(np.abs(s) == 1):
        raise ValueError("signs: every entry must be +1 or -1")
    if s.size == block:
        s = np.tile(s, k // block)
    return h, x, s


def rotate(x, signs, block: int = 1024) -> np.ndarray:
    """float64 [..., K]: per block of B, H_B @ (x * signs) / sqrt(B). signs: B values (the same
    for every block) or K values."""
    h, x, s = _prepare(x, signs, block)
    xb = (x * s).reshape(*x.shape[:-1], -1, block)
    return ((xb @ h) / np.sqrt(block)).reshape(x.shape)   # h symmetric: xb @ h == (h @ xb^T)^T


def unrotate(y, signs, block: int = 1024) -> np.ndarray:
    """Inverse of rotate: per block, (H_B @ y / sqrt(B)) * signs."""
    h, y, s = _prepare(y, signs, block)
    yb = y.reshape(*y.shape[:-1], -1, block)
    return ((yb @ h) / np.sqrt(block)).reshape(y.shape) * s
