"""tools/gluon_small_mma.py (an experiment, not a path) still compiles for sm_90 with the pinned
Triton, and its loop is what results/h200/s8 describes: the code bytes go straight from global
memory into the MMA operand (no shared memory), four int8 MMAs per group and warp tile, and no
byte repacking without the register lookahead."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]


def test_gluon_prototype_compiles_to_the_described_loop():
    cmd = [sys.executable, "tools/gluon_small_mma.py", "compile", "--n", "34816", "--k", "5120", "--m", "16"]
    env = {**os.environ, "TRITON_INTERPRET": "0"}     # Gluon does not run under the interpreter
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    out = r.stdout
    assert "IMMA 16" in out and "PRMT" not in out and "LDS" not in out, (
        f"{out}\nreproduce: TRITON_INTERPRET=0 python tools/gluon_small_mma.py compile")
