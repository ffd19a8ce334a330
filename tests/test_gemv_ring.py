"""gemv's look-ahead ring: DEPTH chunks of weight codes loaded before the PDL wait and kept in
flight, with each chunk's activations loaded before or after the look-ahead's weights
(ACT_FIRST). Neither may change a bit: the FP32 order is the config's fold whatever they are.
Expected values: the FP64 reference's group dots (reference.projection.group_dots, from the
bytes and the reference's own Q8) and the path's emulation under the same config."""
import numpy as np
import pytest
import torch

from kernels import emulation, gemv
from kernels.format import PQ2Weight
from pq2verify.bits import same_bits
from reference import generate as gen, projection

HERE = "tests/test_gemv_ring.py"
# GC = 2 on 12 groups: one split of 6 chunks (DEPTH 1-4 all shift the ring before the end), two
# of 3 (DEPTH 4 looks past the end: predicated off), and a ragged pair of 7 and 5 groups
N, K, GC = 40, 1536, 2
# each ring in both load orders (ACT_FIRST: a chunk's activations before the look-ahead's weights)
RING = [dict(DEPTH=d, SPLIT=1, groups_per_split=12, ACT_FIRST=a) for d in (1, 2, 3, 4) for a in (True, False)]
RING += [dict(DEPTH=d, SPLIT=2, groups_per_split=p, ACT_FIRST=a) for d in (1, 4) for p in (6, 7) for a in (True, False)]


def _label(c):
    return f"DEPTH{c['DEPTH']}-SPLIT{c['SPLIT']}x{c['groups_per_split']}-ACT_FIRST{int(c['ACT_FIRST'])}"


@pytest.mark.parametrize("layout", ["prepared", "raw"])
@pytest.mark.parametrize("kind", ["normal", "outliers", "zero_groups", "ties"])
@pytest.mark.parametrize("cfg", RING, ids=_label)
def test_the_ring_keeps_dots_and_bits(cfg, kind, layout, device):
    dtype = torch.bfloat16 if kind != "ties" else torch.float16
    w = PQ2Weight.from_raw(torch.from_numpy(gen.ternary_weight(N, K, 11)))
    w = (w.to_prepared() if layout == "prepared" else w).to(device)
    x = gen.activations(1, K, 12, kind=kind, dtype=dtype).to(device)
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
        assert same_bits(y, e), "output bytes differ from the emulation's under the config" + where


def test_a_depth_out_of_range_is_refused_naming_the_field(device):
    x = torch.zeros(1, K, dtype=torch.bfloat16, device=device)
    w = PQ2Weight.from_raw(torch.from_numpy(gen.ternary_weight(N, K, 11))).to(device)
    for bad in (0, 5, 2.0):
        with pytest.raises(ValueError, match=f"DEPTH={bad!r}"):
            gemv.run(x, w, config={"DEPTH": bad})
