"""The model runner's projections: T digits summed in one FP32 accumulation and rounded once;
the noise-floor variant folds the K groups in reverse order and computes the same function."""
import numpy as np
import pytest
import torch

from pq2verify import registry
from pq2verify.gsm8k import convert, model as mdl
from reference import metrics
from reference.q8 import quantize_q8


@pytest.fixture
def emulate(monkeypatch):
    """The torch emulation backend on the CPU, legacy kernels (int_gemv for M <= 16)."""
    from kernels import backend
    monkeypatch.setattr(backend, "_cpu_backend", "emulate")
    monkeypatch.setenv("PQ2_KERNELS", "legacy")


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def _layer(w: torch.Tensor, digits, device="cpu"):
    lin = torch.nn.Sequential(torch.nn.Linear(w.shape[1], w.shape[0], bias=False)).to(device)
    with torch.no_grad():
        lin[0].weight.copy_(w)
    usage = mdl.Usage()
    mdl.pq2ify(lin, digits, usage=usage)
    return lin, usage


def _exact(x: torch.Tensor, w: torch.Tensor, digits: int):
    """FP64: sum over digits t and groups g of dot(q_g, d_t,g) * xs_g * scale_t,g, and the sum of
    the terms' magnitudes, from convert.quantize_digits (not from the runner's layout)."""
    d, sc, _ = convert.quantize_digits(w, digits)                     # [T, N, Kp], [T, N, G]
    kp = d.shape[2]
    xp = torch.nn.functional.pad(x, (0, kp - x.shape[1]))
    q8 = quantize_q8(xp)
    q = q8.q.astype(np.float64).reshape(x.shape[0], -1, 128)          # [M, G, 128]
    dd = d.double().numpy().reshape(digits, d.shape[1], -1, 128)       # [T, N, G, 128]
    dots = np.einsum("mgk,tngk->tmng", q, dd)
    terms = dots * q8.scales.astype(np.float64)[None, :, None, :] * sc.double().numpy()[:, None]
    return terms.sum(axis=(0, 3)), np.abs(terms).sum(axis=(0, 3)), digits * q.shape[1]


@pytest.mark.parametrize("device", DEVICES)
def test_digits_are_summed_in_fp32_and_rounded_once(emulate, device):
    """Every output is within half a bf16 spacing (plus the FP32 fold allowance) of the exact
    digit sum. Rounding each digit's output to bf16 before the sum breaks this on most rows."""
    seed = 11
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(64, 200, generator=g) * 0.05
    x = torch.randn(8, 200, generator=g).to(torch.bfloat16)
    lin, usage = _layer(w, 4, device)
    y = lin(x.to(device)).double().cpu().numpy()
    ref, abs_sum, terms = _exact(x, w, 4)
    allow = registry.get("int_gemv").fold_allowance(terms, abs_sum)
    bound = allow + metrics.spacing(np.abs(ref) + allow, torch.bfloat16) / 2
    bad = np.abs(y - ref) > bound
    assert not bad.any(), (f"{int(bad.sum())} of {bad.size} outputs are further than one rounding from the "
                           f"exact digit sum (seed {seed}, {device}); reproduce: pytest {__file__}::"
                           f"test_digits_are_summed_in_fp32_and_rounded_once[{device}]")
    assert set(name for name, _ in usage.calls) == {"int_gemv"} and sum(usage.calls.values()) == 1


def _cancelling_weight():
    """One row, three groups whose partials are +b (tiny), +P, -P: folded 0, 1, 2 the tiny one
    is lost to P (0.0); folded 2, 1, 0 it survives (b)."""
    w = torch.zeros(2, 384)
    w[0, 0], w[0, 128], w[0, 256] = 2.0 ** -10, 65504.0, -65504.0
    x = torch.zeros(1, 384)
    x[0, [0, 128, 256]] = 1.0
    return w, x.to(torch.bfloat16)


def test_reversed_fold_is_another_order_of_the_same_sum(emulate):
    w, x = _cancelling_weight()
    lin, usage = _layer(w, None)
    assert lin[0].stack.digits == 1                                 # ternary per group: lossless
    natural = lin(x)[0, 0].item()
    usage.reverse = ((1, 16),)
    rev = lin(x)[0, 0].item()
    usage.reverse = ((2, None),)                                    # M = 1 outside the ranges
    assert lin(x)[0, 0].item() == natural
    assert natural == 0.0 and rev == pytest.approx(2.0 ** -10, rel=1e-2)
    ref, abs_sum, terms = _exact(x, w, 1)
    allow = registry.get("int_gemv").fold_allowance(terms, abs_sum)[0, 0]
    assert abs(natural - ref[0, 0]) <= allow and abs(rev - ref[0, 0]) <= allow   # both valid orders


@pytest.mark.parametrize("device", DEVICES)
def test_reversed_fold_keeps_every_output_within_one_rounding(emulate, device):
    seed = 12
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(48, 300, generator=g) * 0.05
    x = torch.randn(5, 300, generator=g).to(torch.bfloat16)
    lin, usage = _layer(w, 3, device)
    usage.reverse = ((1, None),)
    y = lin(x.to(device)).double().cpu().numpy()
    ref, abs_sum, terms = _exact(x, w, 3)
    allow = registry.get("int_gemv").fold_allowance(terms, abs_sum)
    assert (np.abs(y - ref) <= allow + metrics.spacing(np.abs(ref) + allow, torch.bfloat16) / 2).all(), \
        f"seed {seed}: pytest {__file__}::test_reversed_fold_keeps_every_output_within_one_rounding[{device}]"


def test_reversed_groups_flips_whole_blocks():
    g = torch.Generator().manual_seed(13)
    w, _ = convert.convert([torch.randn(4, 384, generator=g)], 2)
    r = mdl.reversed_groups(w)
    a = w.to_raw().data.view(4, w.groups, 34)
    assert torch.equal(mdl.reversed_groups(r).to_raw().data, w.to_raw().data)
    assert torch.equal(r.to_raw().data.view(4, w.groups, 34), a.flip(1)) and r.layout == w.layout


def test_model_id_follows_the_content_not_file_times(tmp_path):
    """The id keys runs and conversion caches: a touched or copied file keeps it, one changed
    byte changes it."""
    import os
    from pq2verify.gsm8k.model import model_id
    f = tmp_path / "m.gguf"
    f.write_bytes(b"weights" * 1000)
    a = model_id(str(f))
    os.utime(f, (1, 1))
    assert model_id(str(f)) == a
    g = tmp_path / "copy" / "m.gguf"
    g.parent.mkdir()
    g.write_bytes(f.read_bytes())
    assert model_id(str(g)) == a
    f.write_bytes(b"weights" * 999 + b"Weights")
    assert model_id(str(f)) != a


@pytest.mark.parametrize("digits", [1, 2, 4])
def test_the_weights_input_is_x_at_each_groups_columns(digits):
    """[x | x | ...] by a tiled copy, and the reversed fold's permuted copy, are x's columns of
    each K position (digit t's group j reads x's group j; reversed, position i holds T*G-1-i)."""
    from kernels.format import PQ2Weight
    kp, g = 384, 3
    w = PQ2Weight.from_prepared(torch.zeros(2 * digits * kp // 4 + 2 * digits * g * 2, dtype=torch.uint8),
                                2, digits * kp)
    st = mdl._Stack(w, digits, [2], kp, mdl.Usage())
    x = torch.arange(5 * kp, dtype=torch.float32).reshape(5, kp)            # every value distinct
    order = torch.arange(digits * g)
    for rev, groups in ((False, order % g), (True, order.flip(0) % g)):
        cols = (groups.view(-1, 1) * 128 + torch.arange(128)).reshape(-1)
        assert torch.equal(st.columns(x, rev), x[:, cols]), (digits, rev)
