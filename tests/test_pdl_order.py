"""Programmatic dependent launch: a PDL-launched kernel may run while the previous kernel of
the stream still does, so before griddepcontrol.wait it may read only the weights and write
nothing. pq2verify.ptx checks that in the PTX (certain, where a GPU shows it only when two
grids happen to overlap): first on small hand-written PTX, then on the real kernels compiled
for sm_90 by tools/sm90.py (gemv, small_mma, the quantize kernel)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pq2verify import ptx

ROOT = Path(__file__).parents[1]
PARAMS = ["x_ptr", "codes_ptr", "out_ptr", "N"]


def _kernel(before: str, after: str = "ld.global.b32 %r9, [%rd4];") -> str:
    """A PTX entry with parameters x_ptr, codes_ptr, out_ptr, N: `before` runs ahead of the
    wait, `after` behind it."""
    return f""".visible .entry k(
	.param .u64 k_param_0,
	.param .u64 k_param_1,
	.param .u64 k_param_2,
	.param .u32 k_param_3
)
{{
	.reg .b64 %rd<20>;
	ld.param.u64 	%rd1, [k_param_0];
	ld.param.u64 	%rd2, [k_param_1];
	ld.param.u64 	%rd3, [k_param_2];
	ld.param.u32 	%r1, [k_param_3];
	mul.wide.s32 	%rd5, %r1, 4;
	// begin inline asm
	griddepcontrol.launch_dependents;
	// end inline asm
{before}
	// begin inline asm
	griddepcontrol.wait;
	// end inline asm
$L__BB0_1:
	add.s64 	%rd4, %rd1, %rd5;
	{after}
	ret;
}}
"""


def test_weights_read_before_the_wait_pass():
    k = _kernel("\tadd.s64 \t%rd6, %rd2, %rd5;\n\tcvta.to.global.u64 \t%rd7, %rd6;\n"
                "\t// begin inline asm\n\tmov.u32 %r2, 0x0;\n\t@%p1 ld.global.b32 { %r2 }, [ %rd7 + 0 ];\n"
                "\t// end inline asm")
    assert ptx.before_wait(k, "k", PARAMS, {"codes_ptr", "N"}) == []
    # the same load is seen: with the weights not allowed it is reported, naming its parameter
    bad = ptx.before_wait(k, "k", PARAMS, {"N"})
    assert len(bad) == 1 and "['codes_ptr']" in bad[0]


@pytest.mark.parametrize("before,why", [
    ("\tadd.s64 \t%rd6, %rd1, %rd5;\n\tld.global.nc.b32 \t%r3, [%rd6];", "['x_ptr']"),
    ("\tmad.wide.s32 \t%rd6, %r1, 8, %rd1;\n\t// begin inline asm\n\t{ .reg .b64 t; mov.b64 t, %rd6; "
     "add.s64 %rd8, t, 16; }\n\t// end inline asm\n\tcp.async.cg.shared.global [ %r5 + 0 ], [ %rd8 + 0 ], 0x10;",
     "['x_ptr']"),
    ("\tst.global.b32 \t[%rd3], %r1;", "global write"),
    ("\tatom.global.add.u32 \t%r4, [%rd3], 1;", "global write"),
])
def test_activation_reads_and_any_write_before_the_wait_fail(before, why):
    bad = ptx.before_wait(_kernel(before), "k", PARAMS, {"codes_ptr", "N"})
    assert len(bad) == 1 and why in bad[0], bad


def test_reads_after_the_wait_and_a_missing_wait():
    assert ptx.before_wait(_kernel(""), "k", PARAMS, {"N"}) == []      # x read after the wait
    no_wait = _kernel("").replace("griddepcontrol.wait;", "")
    assert ptx.before_wait(no_wait, "k", PARAMS, {"N"})[-1] == "k: no griddepcontrol.wait"


def test_real_pdl_kernels_touch_only_weights_before_the_wait():
    """gemv, small_mma and the quantize kernel as launched with PDL on the Bonsai shapes.
    gemv prefetches its first chunk of weights before the wait: the check must see those
    reads (or it would pass by seeing nothing)."""
    cmd = [sys.executable, "tools/sm90.py", "pdl", "--json"]
    env = {**os.environ, "TRITON_INTERPRET": "0"}      # the interpreter's kernels do not compile
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    rep = json.loads(r.stdout)
    assert {x["kernel"].split()[0] for x in rep} == {"gemv", "small_mma", "quantize"}
    for x in rep:
        assert x["violations"] == [], (f"{x['kernel']} ({x['entry']}) touches more than weights before "
                                       f"griddepcontrol.wait: {x['violations'][:3]}; reproduce: "
                                       f"TRITON_INTERPRET=0 python tools/sm90.py pdl")
    assert all(x["reads_of_weights"] for x in rep if x["kernel"].startswith("gemv"))
    # every kernel file that launches with PDL is among those checked
    launching = {f"kernels.{f.stem}" for f in (ROOT / "kernels").glob("*.py") if "launch_pdl=" in f.read_text()}
    assert launching <= {x["module"] for x in rep}, (
        f"kernel files launching with PDL but not checked: {sorted(launching - {x['module'] for x in rep})}; "
        f"add them to tools/sm90.py PDL_KERNELS")
