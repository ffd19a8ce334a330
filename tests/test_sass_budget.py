"""small_mma's issue budget, checked without a GPU: its main loop compiled for sm_90
(`python -m pq2verify.sm90 loop`: Triton's compiler and bundled cuobjdump, the JIT's int specialization)
must stay within 0.25 warp-instructions per weight byte on shapes that decide the decode step
(a decode call is issue-bound: ~0.23 at 4.6 TB/s). The earlier byte-wise plane
extraction compiled to 0.50 (`python -m pq2verify.sm90 loop --module <that file>`)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
BUDGET = 0.25


@pytest.mark.parametrize("n,k,m", [(34816, 5120, 16), (5120, 17408, 4)])
def test_small_mma_loop_within_issue_budget(n, k, m):
    cmd = [sys.executable, "-m", "pq2verify.sm90", "loop", "--n", str(n), "--k", str(k), "--m", str(m), "--json"]
    env = {**os.environ, "TRITON_INTERPRET": "0"}     # the interpreter's kernels do not compile
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(r.stdout)
    assert res["loops"], f"no loop in small_mma's SASS for N={n} K={k} M={m}: {res}"
    worst = max(res["loops"], key=lambda lp: lp["warp_instructions_per_byte"])
    assert worst["warp_instructions_per_byte"] <= BUDGET, (
        f"small_mma's loop issues {worst['instructions']} instructions a trip and thread = "
        f"{worst['warp_instructions_per_byte']:.3f} warp-instructions per weight byte > {BUDGET} at N={n} K={k} "
        f"M={m} ({res['config']}, {res['registers']} registers); reproduce: TRITON_INTERPRET=0 "
        f"python -m pq2verify.sm90 loop --n {n} --k {k} --m {m}")
