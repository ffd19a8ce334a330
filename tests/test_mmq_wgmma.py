"""mmq_wgmma: its Gluon kernel (sm_90) and its plain-Triton twin (the interpreter's, and any other
GPU's) compute the same bits, so the CPU suite's checks of the twin speak for the kernel; and the
kernel still compiles, with the pinned Triton, to the loop measured in
results/2026-12-01-prefill-mmq-wgmma/."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kernels import mmq, mmq_wgmma
from pq2verify import inputs

ROOT = Path(__file__).parents[1]

# ragged N and M, one to three groups (fewer than the ring's stages), odd M, M past a tile; the
# larger ones on a GPU only (the interpreter takes minutes there)
CASES = [(100, 384, 17), (300, 640, 70), (64, 256, 129), (96, 128, 33),
         pytest.param(256, 2048, 300, marks=pytest.mark.gpu), pytest.param(5120, 6144, 257, marks=pytest.mark.gpu)]


def _reproduce(n, k, m, dtype, device):
    return (f"reproduce: pytest --device {device} tests/test_mmq_wgmma.py -k '{n}-{k}-{m}-{dtype}' "
            f"(weights seed 1, x seed 2)")


def _case(n, k, m, dtype, device):
    w = inputs.ternary_weight(n, k, seed=1, device=device)
    x = inputs.activations(m, k, seed=2, device=device).to(dict(bf16=torch.bfloat16, fp16=torch.float16)[dtype])
    return w, x


@pytest.mark.exact
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("n,k,m", CASES, ids=lambda v: None)
def test_kernel_equals_its_twin_and_mmq(n, k, m, dtype, device):
    """On sm_90 run() is the Gluon kernel; elsewhere it is the twin (then the comparison with the
    twin is the identity and mmq's bits carry the test)."""
    if device == "cuda" and torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the Gluon kernel runs on sm_90 only")
    w, x = _case(n, k, m, dtype, device)
    g = k // 128
    dk = torch.full((m, n, g), -7, dtype=torch.int32, device=device)
    dt = torch.full_like(dk, -7)
    dm = torch.full_like(dk, -7)
    y = mmq_wgmma.run(x, w, dots=dk)
    yt = mmq_wgmma.twin(x, w, dots=dt)
    ym = mmq.run(x, w, dots=dm)
    why = _reproduce(n, k, m, dtype, device)
    assert torch.equal(dk, dm), f"group dots differ from mmq's in {(dk != dm).sum().item()} of {dk.numel()}; {why}"
    assert torch.equal(dt, dm), f"the twin's dots differ from mmq's; {why}"
    for name, other in (("its twin", yt), ("mmq", ym)):
        diff = (y.view(torch.int16) != other.view(torch.int16)).sum().item()
        assert diff == 0, f"mmq_wgmma differs from {name} in {diff} of {y.numel()} outputs; {why}"


@pytest.mark.gpu
@pytest.mark.exact
@pytest.mark.parametrize("group", [1, 2, 3, 8])
def test_grouped_program_order_writes_every_tile_once(group, device):
    """GROUP_M only reorders the programs. M = 600 is 5 token tiles of 128 (the last short), N = 320
    5 weight tiles of 64: groups of 2 and 3 leave a partial last group, 8 is larger than the tile
    count. The output starts as NaN; every element must equal the default order's (GROUP_M 0)
    and the twin's, bit for bit, so no tile is skipped, written twice with another's rows, or
    taken from outside the matrix."""
    if device != "cuda" or torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("needs an sm_90 GPU (--device cuda on an H100/H200)")
    n, k, m = 320, 384, 600
    w, x = _case(n, k, m, "bf16", device)
    base = mmq_wgmma.run(x, w, config={"BM": 128, "GROUP_M": 0})
    y = torch.full_like(base, float("nan"))
    mmq_wgmma.run(x, w, out=y, config={"BM": 128, "GROUP_M": group})
    yt = mmq_wgmma.twin(x, w, config={"BM": 128})
    why = f"reproduce: pytest --device cuda tests/test_mmq_wgmma.py -k 'grouped and {group}' (weights seed 1, x seed 2)"
    assert not y.isnan().any(), f"{int(y.isnan().sum())} outputs never written with GROUP_M={group}; {why}"
    for name, other in (("GROUP_M 0", base), ("the twin", yt)):
        diff = (y.view(torch.int16) != other.view(torch.int16)).sum().item()
        assert diff == 0, f"GROUP_M={group} differs from {name} in {diff} of {y.numel()} outputs; {why}"


@pytest.mark.gpu
def test_kernel_is_the_gluon_one_on_sm90(device):
    if device != "cuda" or torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("needs an sm_90 GPU (--device cuda on an H100/H200)")
    assert mmq_wgmma._hopper(torch.device("cuda"))


def test_twin_serves_where_gluon_cannot():
    """The interpreter (and a non-CUDA device) never reaches the Gluon kernel."""
    if mmq_wgmma.common.INTERPRET:
        assert not mmq_wgmma._hopper(torch.device("cuda"))
    assert not mmq_wgmma._hopper(torch.device("cpu"))


def test_gluon_kernel_compiles_to_the_measured_loop():
    """Four int8 MMAs per group, no local memory, and at most 168 registers and 77 KB of shared
    memory: three programs of four warps an SM, the occupancy its H200 numbers were measured at."""
    cmd = [sys.executable, "-m", "pq2verify.sm90", "prefill", "--n", "34816", "--k", "5120", "--m", "2048", "--json"]
    env = {**os.environ, "TRITON_INTERPRET": "0"}     # Gluon does not run under the interpreter
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    rep = json.loads(r.stdout)
    why = f"{rep}\nreproduce: TRITON_INTERPRET=0 python -m pq2verify.sm90 prefill --m 2048"
    assert len(rep["loops"]) == 1 and rep["loops"][0]["ops"].get("IGMMA") == 4, why
    assert rep["local"] == 0, why
    assert rep["registers"] <= 168 and rep["shared"] <= 77 * 1024, why
