"""gemv's two kernels: on sm_90 with prepared weights run() launches the Gluon kernel, elsewhere
its plain-Triton twin; both must give the same output bytes and the same integer group dots
under every config, so the CPU suite's checks of the twin speak for the Gluon kernel. The dots
are also held against the FP64 reference's own (reference.projection.group_dots). On the CPU the
GPU cases skip; the config protocol and the sm_90 compile are checked there."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from kernels import gemv
from kernels.format import PQ2Weight
from reference import generate as gen, projection

ROOT = Path(__file__).parents[1]
HERE = "tests/test_gemv_gluon.py"

# (N, K, config fields over the chooser's): the chooser's tiles on the decode shapes (full size:
# lm_head's 248320 rows included), ragged rows, ragged splits and chunks, every DEPTH, GC from 1
# to 64 (a GC past 32 puts two groups in a thread), tiles narrower than the layout (rows repeat
# in threads), 1 to 8 warps, and the dots written.
CASES = [
    (34816, 5120, {}), (5120, 17408, {}), (16384, 5120, {}), (14336, 5120, {}), (5120, 6144, {}),
    (248320, 5120, {}),
    (5000, 6144, {}), (4136, 5120, {}), (100, 384, {}), (6000, 17408, {}),
    (1000, 2688, dict(BN=32, GC=8, SPLIT=3, groups_per_split=7, num_warps=4)),
    (1000, 2688, dict(BN=32, GC=4, SPLIT=2, groups_per_split=11, num_warps=2)),
    (520, 1536, dict(BN=16, GC=2, SPLIT=1, groups_per_split=12, num_warps=4)),
    (520, 1536, dict(BN=128, GC=1, SPLIT=2, groups_per_split=6, num_warps=8)),
    (520, 4096, dict(BN=8, GC=32, SPLIT=1, groups_per_split=32, num_warps=1)),
    (520, 8192, dict(BN=4, GC=64, SPLIT=1, groups_per_split=64, num_warps=1)),
] + [(3000, 6144, dict(BN=64, GC=8, SPLIT=2, groups_per_split=24, DEPTH=d, num_warps=8)) for d in (1, 2, 3, 4)]
CASES += [(3000, 6144, dict(BN=64, GC=8, SPLIT=4, groups_per_split=13, DEPTH=d, num_warps=8)) for d in (2, 4)]


def _id(case):
    n, k, f = case
    return f"{n}x{k}" + "".join(f"-{a}{v}" for a, v in sorted(f.items()))


def _sm90(device):
    if device != "cuda":
        pytest.skip("the Gluon kernel needs a GPU (--device cuda)")
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the Gluon kernel runs on sm_90 only")


@pytest.mark.gpu
@pytest.mark.exact
@pytest.mark.parametrize("pair", [False, True], ids=["whole", "pair"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("case", CASES, ids=_id)
def test_gluon_kernel_equals_its_twin(case, dtype, pair, device):
    """whole: a thread holds a group's eight words; pair: two lanes hold four each (PAIR)."""
    _sm90(device)
    n, k, fields = case
    fields = {**fields, "PAIR": pair}
    seed = n + k
    w = PQ2Weight.from_raw(torch.from_numpy(gen.ternary_weight(n, k, seed))).to_prepared().to(device)
    x = gen.activations(1, k, seed + 1, kind="outliers", dtype=dtype).to(device)
    cfg = {**gemv.config(n, k, 1), **fields}
    why = (f"\n  N={n} K={k} M=1 {dtype} prepared, config {cfg}, weight seed {seed}, x seed {seed + 1} (outliers)"
           f"\n  reproduce: .venv/bin/python -m pytest -q --device cuda '{HERE}' -k '{_id(case)} and {'pair' if pair else 'whole'}'")
    assert gemv.gluon_runs(w, {**cfg, "GLUON": True}, x.device), "the Gluon kernel would not run here" + why
    g = k // 128
    out = {}
    for gl in (True, False):
        d = torch.full((1, n, g), -7, dtype=torch.int32, device=device)
        y = torch.full((1, n), float("nan"), dtype=dtype, device=device)
        gemv.run(x, w, out=y, dots=d, config={**cfg, "GLUON": gl})
        out[gl] = (y, d)
    (y1, d1), (y0, d0) = out[True], out[False]
    assert torch.equal(d1, d0), f"group dots differ from the twin's in {(d1 != d0).sum().item()} places" + why
    diff = (y1.view(torch.int16) != y0.view(torch.int16)).sum().item()
    assert diff == 0, f"output bytes differ from the twin's in {diff} of {n}" + why
    if n * k <= 6000 * 17408:
        want = projection.group_dots(x.cpu(), w.data.cpu().numpy(), layout="prepared", n=n, k=k)
        got = d1.cpu().numpy()
        assert np.array_equal(got, np.asarray(want, dtype=got.dtype)), (
            f"group dots differ from the FP64 reference's in {int((got != want).sum())} places" + why)


@pytest.mark.gpu
def test_gluon_kernel_reruns_give_the_same_bits(device):
    """Split-K summed by the last program to arrive: the same bytes whichever program it is."""
    _sm90(device)
    n, k = 5120, 17408
    w = PQ2Weight.from_raw(torch.from_numpy(gen.ternary_weight(n, k, 5))).to_prepared().to(device)
    x = gen.activations(1, k, 6, dtype=torch.bfloat16).to(device)
    first = gemv.run(x, w)
    assert gemv.config(n, k, 1)["SPLIT"] > 1, "the case must split K"
    for i in range(50):
        again = gemv.run(x, w)
        assert torch.equal(again.view(torch.int16), first.view(torch.int16)), (
            f"rerun {i} differs; reproduce: .venv/bin/python -m pytest -q --device cuda '{HERE}' -k reruns")


def test_the_twin_serves_where_gluon_cannot(device):
    """The interpreter, a CPU tensor, raw weights and GLUON False never reach the Gluon kernel."""
    w = PQ2Weight.from_raw(torch.from_numpy(gen.ternary_weight(64, 256, 1)))
    cfg = gemv.config(64, 256, 1, interpret=False)
    assert cfg["GLUON"] is True
    assert not gemv.gluon_runs(w.to_prepared(), cfg, torch.device("cpu"))
    assert gemv.config(64, 256, 1, interpret=True)["GLUON"] is False
    if device == "cuda" and not gemv.common.INTERPRET:
        assert not gemv.gluon_runs(w.to(device), cfg, torch.device(device))                    # raw
        assert not gemv.gluon_runs(w.to_prepared().to(device), {**cfg, "GLUON": False}, torch.device(device))


def test_a_bad_gluon_field_is_refused_naming_it(device):
    x = torch.zeros(1, 256, dtype=torch.bfloat16, device=device)
    w = PQ2Weight.from_raw(torch.from_numpy(gen.ternary_weight(64, 256, 1))).to(device)
    for bad in (1, "yes", None):
        with pytest.raises(ValueError, match="GLUON"):
            gemv.run(x, w, config={"GLUON": bad})


def test_gluon_kernel_compiles_for_sm90_with_fewer_instructions_a_byte():
    """The sm_90 compile of the chooser's configs on shapes of four or more chunks a program: the
    Gluon kernel's loop spends fewer instructions a chunk than the twin's (the reason it exists;
    at DEPTH 1 its loop body is two chunks), with no local memory."""
    code = (
        "from pq2verify.sm90 import compiler, launches\n"
        "for n, k in ((34816, 5120), (5120, 17408), (5120, 6144), (248320, 5120)):\n"
        "    per = {}\n"
        "    for gl in (False, True):\n"
        "        c, args, opts = launches.gemv_launch(n, k, force={'GLUON': gl})\n"
        "        kern, _ = compiler.compile_sm90(*args, **opts)\n"
        "        sass, _ = compiler.sass_and_registers(kern)\n"
        "        loop = [sum(b.values()) for _, _, b in compiler.loops(sass)]\n"
        "        assert len(loop) == 1, (n, k, gl, loop)\n"
        "        assert compiler.resource_usage(kern)['local'] == 0, (n, k, gl)\n"
        "        trip = 2 if gl and c['DEPTH'] == 1 else 1\n"
        "        per[gl] = loop[0] / trip / (c['BN'] * c['GC'] * 32)\n"
        "    print(n, k, per)\n"
        "    assert per[True] < 0.8 * per[False], (n, k, per)\n")
    env = {**os.environ, "TRITON_INTERPRET": "0"}     # Gluon does not run under the interpreter
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
