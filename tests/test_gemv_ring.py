"""gemv's look-ahead ring (DEPTH chunks in flight, loaded before the PDL wait) and its fused
quantize (FUSE: one kernel a call). Neither may change a bit: the FP32 order is the config's
fold whatever DEPTH is, and the fused kernel's Q8 codes, scales and sums must be the quantize
kernel's. Expected values: the FP64 reference's group dots (reference.projection.group_dots,
from the bytes and the reference's own Q8) and the path's emulation under the same config."""
import numpy as np
import pytest
import torch

from kernels import emulation, gemv
from kernels.format import PQ2Weight
from pq2verify.bits import same_bits
from reference import generate as gen, projection

HERE = "tests/test_gemv_ring.py"
# CHUNKS = 3 (GC = 2, 6 groups a split): DEPTH 1-2 shift the ring inside the split, DEPTH 3
# loads it all before the wait, DEPTH 4 looks past its end (predicated off)
N, K, GC = 40, 768, 2
RING = [dict(DEPTH=d, FUSE=f, SPLIT=1, groups_per_split=6) for d in (1, 2, 3, 4) for f in (False, True)]
RING += [dict(DEPTH=d, FUSE=False, SPLIT=2, groups_per_split=3) for d in (1, 4)]


def _label(c):
    return f"DEPTH{c['DEPTH']}-FUSE{int(c['FUSE'])}-SPLIT{c['SPLIT']}"


def _inputs(kind, dtype, device, layout):
    w = PQ2Weight.from_raw(torch.from_numpy(gen.ternary_weight(N, K, 11)))
    if layout == "prepared":
        w = w.to_prepared()
    x = gen.activations(1, K, 12, kind=kind, dtype=dtype)
    return x.to(device), w.to(device)


@pytest.mark.parametrize("layout", ["prepared", "raw"])
@pytest.mark.parametrize("kind", ["normal", "outliers", "zero_groups", "ties"])
@pytest.mark.parametrize("cfg", RING, ids=_label)
def test_ring_and_fused_quantize_keep_dots_and_bits(cfg, kind, layout, device):
    dtype = torch.bfloat16 if kind != "ties" else torch.float16
    x, w = _inputs(kind, dtype, device, layout)
    cfg = {**cfg, "BN": 16, "GC": GC, "PDL": True}
    dots = torch.empty(1, N, K // 128, dtype=torch.int32, device=device)
    y = gemv.run(x, w, dots=dots, config=cfg)
    where = (f"\n  config {cfg}, kind {kind}, {dtype}, {layout}, N={N} K={K} M=1, seeds 11/12"
             f"\n  reproduce: .venv/bin/python -m pytest -q --device {device} '{HERE}' -k '{_label(cfg)} and {kind} and {layout}'")
    want = projection.group_dots(x.cpu(), w.data.cpu().numpy(), layout=w.layout, n=N, k=K)
    got = dots.cpu().numpy()
    assert np.array_equal(got, np.asarray(want, dtype=got.dtype)), (
        f"integer group dots differ from the FP64 reference's in {int((got != want).sum())} places" + where)
    if device == "cpu":   # a GPU may contract the fold into an FMA; the interpreter's bytes are the emulation's
        e = emulation.emulate("gemv", x, w, config=cfg, interpret=True)
        assert same_bits(y.cpu(), e), "output bytes differ from the emulation's under the config" + where


def test_a_nan_activation_group_poisons_its_rows_alone_when_fused(device):
    """The fused quantize gives a NaN group a NaN scale, as the quantize kernel does; every row
    then reads NaN (each row sums every group), and the unfused call agrees bit for bit."""
    x, w = _inputs("normal", torch.bfloat16, device, "prepared")
    x[0, 300] = float("nan")
    base = {"BN": 16, "GC": GC, "SPLIT": 1, "groups_per_split": 6, "PDL": True, "DEPTH": 2}
    fused = gemv.run(x, w, config={**base, "FUSE": True})
    plain = gemv.run(x, w, config={**base, "FUSE": False})
    assert torch.isnan(fused.float()).all(), f"fused: {fused}"
    assert same_bits(fused.cpu(), plain.cpu())


def test_fuse_with_split_is_refused_naming_the_field():
    x = torch.zeros(1, K, dtype=torch.bfloat16)
    w = PQ2Weight.from_raw(torch.from_numpy(gen.ternary_weight(N, K, 11)))
    with pytest.raises(ValueError, match="FUSE=True needs SPLIT=1"):
        gemv.run(x, w, config={"FUSE": True, "SPLIT": 2, "groups_per_split": 3})
    with pytest.raises(ValueError, match="DEPTH=5"):
        gemv.run(x, w, config={"DEPTH": 5})
