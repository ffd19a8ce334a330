"""tools/profile/gemv_stages.py: the stage that does all of gemv's work must give gemv's bits
(the profile's stage times are only a split of gemv's call if it is gemv), and so must the fold
stage where a shape has one split (it then stores the output itself). The expected bits are
gemv.run's under the same config; the output is NaN-filled first, so a stage that writes nothing
cannot pass, and the split-K counters must be left at zero for the next call."""
import sys
from pathlib import Path

import pytest
import torch

from kernels import gemv, prepare
from kernels.format import PQ2Weight
from pq2verify.bits import same_bits
from reference import generate as gen

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools" / "profile"))
import gemv_stages  # noqa: E402

HERE = "tests/test_profile_gemv_stages.py"
N, K = 40, 1536
CONFIGS = [dict(DEPTH=d, SPLIT=s, groups_per_split=p) for d in (1, 2) for s, p in ((1, 12), (2, 6), (2, 7))]


def _label(c):
    return f"DEPTH{c['DEPTH']}-SPLIT{c['SPLIT']}x{c['groups_per_split']}"


def _run(stage, x, w, cfg, device):
    q, xs, t = prepare.quantize_q8(x, order="plane")
    count = torch.zeros(-(-N // cfg["BN"]), dtype=torch.int32, device=device)
    part = torch.empty(cfg["SPLIT"] * N, dtype=torch.float32, device=device)
    out = torch.full((1, N), float("nan"), dtype=x.dtype, device=device)
    gemv_stages.launch(stage, q, xs, t, w, out, cfg, pdl=torch.device(device).type == "cuda", count=count, part=part)
    return out, count


@pytest.mark.parametrize("layout", ["prepared", "raw"])
@pytest.mark.parametrize("cfg", CONFIGS, ids=_label)
def test_the_full_stage_is_gemv(cfg, layout, device):
    w = PQ2Weight.from_raw(torch.from_numpy(gen.ternary_weight(N, K, 21)))
    w = (w.to_prepared() if layout == "prepared" else w).to(device)
    x = gen.activations(1, K, 22, dtype=torch.bfloat16).to(device)
    cfg = {**cfg, "BN": 16, "GC": 2, "PDL": True, "num_warps": 4}
    want = gemv.run(x, w, config=cfg)
    stages = ("fold", "full") if cfg["SPLIT"] == 1 else ("full",)
    for stage in stages:
        got, count = _run(stage, x, w, cfg, device)
        where = (f"stage {stage}, config {cfg}, {layout}, N={N} K={K} M=1, seeds 21/22\n  reproduce: "
                 f".venv/bin/python -m pytest -q --device {device} '{HERE}' -k '{_label(cfg)} and {layout}'")
        assert same_bits(got, want), f"the stage's output differs from gemv's: {where}"
        assert not count.any(), f"split-K counters left non-zero: {count.tolist()}; {where}"


def test_a_depth_the_stages_lack_is_refused(device):
    w = PQ2Weight.from_raw(torch.from_numpy(gen.ternary_weight(N, K, 21))).to_prepared().to(device)
    x = gen.activations(1, K, 22, dtype=torch.bfloat16).to(device)
    cfg = dict(BN=16, GC=2, PDL=True, num_warps=4, DEPTH=3, SPLIT=1, groups_per_split=12)
    with pytest.raises(ValueError, match="DEPTH 3 not supported"):
        _run("full", x, w, cfg, device)
