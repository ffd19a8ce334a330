"""gemv_pair: gemv's arithmetic and FP32 order, per token, with each weight word loaded once
for both tokens of M = 2. Expected values: the FP64 reference's group dots (reference.projection,
from the bytes and the reference's own Q8), and gemv's output for each row alone under the
same fold fields, which is the same sequence of integer dots and FP32 operations per element
(the derivation in kernels/gemv_pair.py's docstring), so the bytes must be equal."""
import numpy as np
import pytest
import torch

from kernels import gemv, gemv_pair
from kernels.format import PQ2Weight
from pq2verify import registry
from pq2verify.bits import same_bits
from reference import generate as gen, projection

HERE = "tests/test_gemv_pair.py"
# N = 40: a ragged 16- and 32-row tile; K = 1536: 12 groups, so GC = 2, 4 and 8 give whole,
# several and ragged chunks, and the splits below an even and a ragged cut
N, K = 40, 1536
CONFIGS = [dict(BN=16, GC=2, SPLIT=1, groups_per_split=12, DEPTH=1, num_warps=4),
           dict(BN=32, GC=4, SPLIT=2, groups_per_split=6, DEPTH=2, num_warps=4),
           dict(BN=16, GC=8, SPLIT=2, groups_per_split=7, DEPTH=1, num_warps=2),
           dict(BN=32, GC=2, SPLIT=3, groups_per_split=4, DEPTH=2, num_warps=8)]


def _label(c):
    return f"BN{c['BN']}-GC{c['GC']}-SPLIT{c['SPLIT']}x{c['groups_per_split']}-DEPTH{c['DEPTH']}"


def _weight(layout, device):
    w = PQ2Weight.from_raw(torch.from_numpy(gen.ternary_weight(N, K, 21)))
    return (w.to_prepared() if layout == "prepared" else w).to(device)


@pytest.mark.parametrize("layout", ["prepared", "raw"])
@pytest.mark.parametrize("cfg,kind", [(c, ("outliers", "zero_groups")[i % 2]) for i, c in enumerate(CONFIGS)],
                         ids=lambda v: _label(v) if isinstance(v, dict) else v)
def test_each_row_has_gemv_bits_and_the_reference_dots(cfg, kind, layout, device):
    m = 2
    w = _weight(layout, device)
    x = gen.activations(m, K, 22, kind=kind, dtype=torch.bfloat16).to(device)
    dots = torch.full((m, N, K // 128), -7, dtype=torch.int32, device=device)
    y = gemv_pair.run(x, w, dots=dots, config=cfg)
    where = (f"\n  config {cfg}, M=2, {kind}, {layout}, N={N} K={K}, seeds 21/22"
             f"\n  reproduce: .venv/bin/python -m pytest -q --device {device} '{HERE}' -k '{_label(cfg)} and {kind} and {layout}'")
    want = projection.group_dots(x.cpu(), w.data.cpu().numpy(), layout=w.layout, n=N, k=K)
    got = dots.cpu().numpy()
    assert np.array_equal(got, np.asarray(want, dtype=got.dtype)), (
        f"integer group dots differ from the FP64 reference's in {int((got != np.asarray(want)).sum())} places" + where)
    fold = {f: cfg[f] for f in ("GC", "SPLIT", "groups_per_split")}
    for i in range(m):
        alone = gemv.run(x[i:i + 1].contiguous(), w, config={**fold, "BN": 16, "num_warps": 4})
        assert same_bits(y[i:i + 1], alone), f"row {i} differs from gemv's bytes for that row alone" + where


def test_its_fold_is_gemvs_under_the_same_fields():
    # the emulation and the exact set read the fold: it must name gemv's order, fields and all
    for n, k in ((40, 1536), (5120, 17408), (34816, 5120)):
        for interpret in (True, False):
            c = gemv_pair.config(n, k, 2, interpret)
            fields = {f: c[f] for f in ("GC", "SPLIT", "groups_per_split")}
            assert gemv_pair.fold(n, k, 2, interpret) == gemv.fold(n, k, 1, interpret, config=fields)


def test_the_chooser_keeps_gemvs_splits():
    for n, k in ((5120, 6144), (5120, 17408), (16384, 5120), (248320, 5120), (96, 640)):
        for interpret in (True, False):
            t, g = gemv_pair.config(n, k, 2, interpret), gemv.config(n, k, 1, interpret)
            assert (t["SPLIT"], t["groups_per_split"]) == (g["SPLIT"], g["groups_per_split"])


def test_the_table_serves_two_tokens_before_small_mma():
    p = registry.get("gemv_pair")
    assert [m for m in range(1, 17) if p.serves(m)] == [2]
    names = [e.name for e in registry.paths(kset="tuned")]
    assert names.index("gemv_pair") < names.index("small_mma")
    assert p.dots_equal_to == "int_gemv" and p.bit_identical_to is None


@pytest.mark.parametrize("m", [1, 3])
def test_another_m_is_refused_before_any_work(m, device):
    w = _weight("prepared", device)
    x = torch.zeros(m, K, dtype=torch.bfloat16, device=device)
    out = torch.full((m, N), 7.0, dtype=torch.bfloat16, device=device)
    for check in (True, False):     # the table's check, and the kernel's own where a caller skips it
        with pytest.raises(ValueError, match="gemv_pair"):
            gemv_pair.run(x, w, out=out, check=check)
    assert bool((out == 7.0).all()), "a refused call wrote its output"
