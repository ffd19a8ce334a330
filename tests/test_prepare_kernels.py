"""The helper kernels of kernels/prepare.py against reference/, on the backend under test (the
interpreter on the CPU, the GPU with --device cuda): Q8 quantization (plain and plane order,
scales and group sums) and raw -> prepared conversion byte for byte; the Hadamard rotation,
which is floating, within its derived per-element bound."""
import math

import numpy as np
import pytest
import torch

from kernels import prepare
from kernels.format import PQ2Weight
from pq2verify.inputs import ACTIVATION_KINDS, activations, ternary_weight
from reference import hadamard, metrics, pq2, q8

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def _dev(device):
    return "cuda" if device == "cuda" else "cpu"


def _x(kind, dtype, device, m=3, k=384, strided=False):
    return activations(m, k, 17 + ACTIVATION_KINDS.index(kind), kind, DTYPES[dtype], _dev(device),
                       row_stride=2 * k if strided else None)


def _tiny(dtype, device, m=2, k=256):
    """Subnormal and near-subnormal activations: the scale amax/127 is subnormal in FP32 for
    bf16 inputs near 2^-126, and fp16 subnormals reach Q8 unchanged."""
    g = torch.Generator().manual_seed(5)
    lo = -135 if dtype == "bf16" else -24
    e = torch.randint(lo, lo + 10, (m, k), generator=g).float()
    v = torch.randn(m, k, generator=g).sign() * torch.exp2(e) * (1 + torch.rand(m, k, generator=g))
    return v.to(DTYPES[dtype]).to(_dev(device))


def _same_q8(got, want, what):
    q, s, t = (a.cpu().numpy() for a in got)
    assert q.dtype == np.int8 and np.array_equal(q, want.q), f"{what}: codes differ at {np.argwhere(q != want.q)[:3].tolist()}"
    assert np.array_equal(s.view(np.int32), want.scales.view(np.int32)), \
        f"{what}: scale bits differ at {np.argwhere(s.view(np.int32) != want.scales.view(np.int32))[:3].tolist()}"
    assert np.array_equal(t, want.sums), f"{what}: group sums differ"


@pytest.mark.parametrize("order", q8.ORDERS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ACTIVATION_KINDS)
def test_quantize_q8_bytes_equal_the_reference(kind, dtype, order, device):
    for strided in (False, True):
        x = _x(kind, dtype, device, strided=strided)
        _same_q8(prepare.quantize_q8(x, order), q8.quantize_q8(x, order=order), f"{kind} {dtype} {order} strided={strided}")


@pytest.mark.parametrize("order", q8.ORDERS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_quantize_q8_subnormal_inputs(dtype, order, device):
    x = _tiny(dtype, device)
    _same_q8(prepare.quantize_q8(x, order), q8.quantize_q8(x, order=order), f"subnormal {dtype} {order}")


@pytest.mark.parametrize("m", (1, 17))
def test_quantize_q8_many_units_and_a_ragged_last_program(m, device):
    """M*G units not a multiple of the program's unit count (8 on a GPU, up to 256 on the
    interpreter): the masked last program must write its units and nothing else."""
    x = _x("normal", "bf16", device, m=m, k=128 * 35)
    _same_q8(prepare.quantize_q8(x, "plane"), q8.quantize_q8(x, order="plane"), f"M={m}")


def test_quantize_q8_nan_group_gets_a_nan_scale(device):
    """The reference refuses NaN (Q8 of NaN is undefined); the kernel marks the group's scale
    NaN so every integer path turns the row NaN. The other groups and rows are unaffected."""
    x = _x("normal", "bf16", device)
    clean = q8.quantize_q8(x)
    x[1, 130] = float("nan")
    q, s, t = (a.cpu().numpy() for a in prepare.quantize_q8(x))
    assert np.isnan(s[1, 1]) and np.isfinite(np.delete(s.reshape(-1), 1 * 3 + 1)).all()
    keep = np.ones(s.shape, bool)
    keep[1, 1] = False
    assert np.array_equal(s[keep].view(np.int32), clean.scales[keep].view(np.int32))
    assert np.array_equal(t[keep], clean.sums[keep])
    assert np.array_equal(np.delete(q.reshape(3, 3, 128), 1, axis=1)[1], np.delete(clean.q.reshape(3, 3, 128), 1, axis=1)[1])


@pytest.mark.parametrize("n,k", [(1, 128), (5, 384), (67, 256)])
def test_raw_to_prepared_bytes_equal_the_reference(n, k, device):
    """Any bytes (code 3 included: this is a copy, validation is separate), N not a multiple
    of the program's rows (64 on the interpreter, 4 on a GPU), rows of 34*G bytes."""
    g = torch.Generator().manual_seed(n * k)
    raw = torch.randint(0, 256, (n, k // 128 * 34), generator=g, dtype=torch.uint8).to(_dev(device))
    want = pq2.raw_to_prepared(raw.cpu().numpy())
    got = prepare.raw_to_prepared(raw)
    assert got.dtype == torch.uint8 and got.shape == (n * k // 128 * 34,)
    assert np.array_equal(got.cpu().numpy(), want), f"first difference at byte {np.argmax(got.cpu().numpy() != want)}"


def test_raw_to_prepared_of_a_weight(device):
    w = ternary_weight(33, 640, 9, _dev(device), "raw")
    p = prepare.raw_to_prepared(w)
    assert isinstance(p, PQ2Weight) and (p.layout, p.n, p.k) == ("prepared", 33, 640)
    assert np.array_equal(p.data.cpu().numpy(), pq2.raw_to_prepared(w.data.cpu().numpy()))
    assert torch.equal(p.data, w.to_prepared().data)
    assert prepare.raw_to_prepared(p) is p


def _rotation_bound(x, y64, block):
    """Per element |y - Y| <= F + spacing(|Y| + F)/2. Each output is a +-1 combination of B
    inputs formed by log2(B) butterfly stages (a sum tree of depth log2 B: at most log2(B)
    roundings on any path), times fp32(1/sqrt(B)) (one rounding of the constant, one of the
    product): F = (log2 B + 3) * 2^-24 * sum_j |x_j| / sqrt(B) (+1 for second-order terms),
    then one rounding to the output dtype."""
    xa = np.abs(metrics.to_float64(x)).reshape(x.shape[0], -1, block).sum(-1, keepdims=True)
    s = np.broadcast_to(xa, (x.shape[0], x.shape[1] // block, block)).reshape(x.shape) / math.sqrt(block)
    f = (math.log2(block) + 3) * 2.0 ** -24 * s
    return f + metrics.spacing(np.abs(y64) + f, x.dtype) / 2


@pytest.mark.parametrize("block", (32, 128, 1024))
@pytest.mark.parametrize("dtype", DTYPES)
def test_rotate_within_its_bound(block, dtype, device):
    for kind, per_block in (("normal", True), ("outliers", False)):
        x = _x(kind, dtype, device, m=3, k=2048)
        signs = hadamard.random_signs(block if per_block else 2048, block)
        y = prepare.rotate(x, torch.tensor(signs, dtype=torch.float32, device=x.device), block)
        want = hadamard.rotate(x, signs, block)
        err = np.abs(metrics.to_float64(y) - want)
        bound = _rotation_bound(x, want, block)
        assert y.dtype == x.dtype and (err <= bound).all(), \
            f"{kind} B={block}: worst {np.max(err / bound):.3g}x the bound at {np.unravel_index(np.argmax(err / bound), err.shape)}"
        # the bound is tight enough to see one spacing: a wrong sign in one block fails it
        wrong = hadamard.rotate(x, signs * np.where(np.arange(signs.size) == 3, -1, 1), block)
        assert not (np.abs(metrics.to_float64(y) - wrong) <= bound).all()


def test_rotate_strided_rows(device):
    x = _x("heavy", "bf16", device, m=5, k=1024, strided=True)
    signs = hadamard.random_signs(1024, 3)
    y = prepare.rotate(x, torch.tensor(signs, dtype=torch.float32, device=x.device), 1024)
    y2 = prepare.rotate(x.contiguous(), torch.tensor(signs, dtype=torch.float32, device=x.device), 1024)
    assert torch.equal(y.view(torch.int16), y2.view(torch.int16))
