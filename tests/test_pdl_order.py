"""Programmatic dependent launch: a PDL-launched kernel may run while the previous kernel of
the stream still does, so before griddepcontrol.wait it may read only the weights and write
nothing. pq2verify.sm90.ptx checks that in the PTX (certain, where a GPU shows it only when two
grids happen to overlap): first on small hand-written PTX, then on the real kernels compiled
for sm_90 by `python -m pq2verify.sm90 pdl` (gemv, small_mma, the quantize kernel), once per compiled
specialization of every shape and M that the bench, the GPU check and the GSM8K model run,
single-split included. The compiles run once per module (a subprocess: the suite's
interpreter kernels do not compile) and take about 45 s on one core with a cold Triton cache."""
import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pq2verify import bench, cases, registry
from pq2verify.sm90 import ptx

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


@pytest.mark.parametrize("before,why", [
    ("\tsetp.eq.s32 \t%p1, %r1, 1;\n\t@%p1 bra \t$L__BB0_1;", "control flow before griddepcontrol.wait"),
    ("\tsetp.eq.s32 \t%p1, %r1, 1;\n\t@%p1 ret;", "control flow before griddepcontrol.wait"),
])
def test_a_branch_around_the_wait_fails(before, why):
    """A wait some programs or configs skip proves nothing for them: a branch before it is a
    violation (5f06600 stopped at the first wait in the text, taken or not)."""
    bad = ptx.before_wait(_kernel(before), "k", PARAMS, {"codes_ptr", "N"})
    assert len(bad) == 1 and why in bad[0], bad


def test_a_predicated_wait_fails():
    k = _kernel("\tsetp.eq.s32 \t%p1, %r1, 1;").replace("\tgriddepcontrol.wait;", "\t@%p1 griddepcontrol.wait;")
    bad = ptx.before_wait(k, "k", PARAMS, {"codes_ptr", "N"})
    assert len(bad) == 1 and "predicated" in bad[0], bad


def test_reads_after_the_wait_and_a_missing_wait():
    assert ptx.before_wait(_kernel(""), "k", PARAMS, {"N"}) == []      # x read after the wait
    no_wait = _kernel("").replace("griddepcontrol.wait;", "")
    assert ptx.before_wait(no_wait, "k", PARAMS, {"N"})[-1] == "k: no griddepcontrol.wait"


REPRO = "TRITON_INTERPRET=0 .venv/bin/python -m pq2verify.sm90 pdl"
# The GSM8K model's PQ2 matrices, by hand from SmolLM2-135M's config (hidden 576, intermediate
# 1536, 9 query and 3 key/value heads of 64): q/k/v stacked (576 + 2 * 192 = 960 rows) and
# gate/up stacked (2 * 1536); K padded to whole 128-groups (576 -> 640), times the digits.
MODEL = [(n, d * k) for n, k in ((960, 640), (576, 640), (3072, 640), (576, 1536)) for d in (4, 1)]


def _sm90(*args: str) -> list[dict]:
    cmd = [sys.executable, "-m", "pq2verify.sm90", "pdl", "--json", *args]
    env = {**os.environ, "TRITON_INTERPRET": "0"}      # the interpreter's kernels do not compile
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode in (0, 1) and r.stdout.strip(), f"{' '.join(cmd)}: exit {r.returncode}\n{r.stderr[-3000:]}"
    return json.loads(r.stdout)


@functools.cache
def _report() -> list[dict]:
    return _sm90()


def _expected_uses() -> set[tuple]:
    """(path, N, K, M, dtype, layout) of every call a PDL path serves in the runs: the
    bonsai27b shapes at the bench's step and shape-row Ms and the check's Ms; the model's at
    every decode M (1-16, rows still generating)."""
    big = set(bench.STEP_MS) | set(bench.DEFAULT_MS) | set(cases.MS["bonsai27b"])
    calls = [(n, k, m) for _, n, k in cases.SHAPES["bonsai27b"]["pq2"] for m in big]
    calls += [(n, k, m) for n, k in MODEL for m in range(1, 17)]
    out = set()
    for name in ("gemv", "gemv_pair", "small_mma"):
        p = registry.get(name)
        out |= {(name, n, k, m, dt, lay) for n, k, m in calls if p.serves(m)
                for dt in ("bf16", "fp16") for lay in p.layouts}
    return out


def _use(path: str, use: str) -> tuple:
    shape, nk, m, dt, lay = use.split()
    n, k = nk.split("x")
    return (path, int(n), int(k), int(m[2:]), dt, lay)


def test_real_pdl_kernels_touch_only_weights_before_the_wait():
    """gemv, gemv_pair, small_mma and the quantize kernel as launched with PDL. gemv and gemv_pair
    prefetch their first chunk of weights before the wait: the check must see those reads (or it
    would pass by seeing nothing)."""
    rep = _report()
    assert {x["kernel"].split()[0] for x in rep} == {"gemv", "gemv_pair", "small_mma", "quantize"}
    for x in rep:
        assert x["violations"] == [], (f"{x['kernel']} ({x['entry']}) touches more than weights before "
                                       f"griddepcontrol.wait: {x['violations'][:3]}; reproduce: {REPRO}")
    assert all(x["reads_of_weights"] for x in rep if x["kernel"].startswith("gemv"))
    # every kernel file that launches with PDL is among those checked
    launching = {f"kernels.{f.stem}" for f in (ROOT / "kernels").glob("*.py") if "launch_pdl=" in f.read_text()}
    assert launching <= {x["module"] for x in rep}, (
        f"kernel files launching with PDL but not checked: {sorted(launching - {x['module'] for x in rep})}; "
        f"add them to pq2verify/sm90/pdl.py PDL_PATHS")


def test_every_pdl_launch_of_the_runs_is_checked():
    """Each call a PDL path serves in the bench, the GPU check and the GSM8K model is among the
    compiled launches' uses (with its quantize kernel), and both single-split and split
    launches of gemv and small_mma are among them: 5f06600 checked six launches, none a
    single-split small_mma (lm_head at M = 2-16, the model's x1 gate/up)."""
    rep = _report()
    got = {_use(x["kernel"].split()[0], u) for x in rep if not x["kernel"].startswith("quantize") for u in x["uses"]}
    quant = {u for x in rep if x["kernel"].startswith("quantize") for u in x["uses"]}
    want = _expected_uses()
    assert want <= got, f"calls whose PDL launch is not compiled: {sorted(want - got)[:5]}; reproduce: {REPRO}"
    assert {u[1:] for u in got} <= {_use("", u)[1:] for u in quant}, "a PDL launch without its quantize kernel"
    from kernels import gemv, gemv_pair, small_mma
    mods = {"gemv": gemv, "gemv_pair": gemv_pair, "small_mma": small_mma}
    split = {(p, n, k, m): mods[p].config(n, k, m, interpret=False)["SPLIT"] for p, n, k, m, _, _ in want}
    for p in mods:
        seen = {x["splits"] == 1 for x in rep if x["kernel"].split()[0] == p}
        assert seen == {True, False}, f"{p}: single-split and split launches expected, got single={seen}"
    assert split[("small_mma", 248320, 5120, 16)] == 1       # lm_head: the case 5f06600 never compiled
    # the quantize kernel as single-split calls launch it (no counters; 5f06600 compiled M=1 K=5120
    # with 544, a launch that never happens) and as split ones do
    zeroes = {"counters=0" in x["kernel"] for x in rep if x["kernel"].startswith("quantize")}
    assert zeroes == {True, False}, "quantize launches with and without split-K counters expected"
    # the compiles' own reported splits agree with the choosers'
    for x in rep:
        name = x["kernel"].split()[0]
        if name != "quantize":
            assert all(split[_use(name, u)[:4]] == x["splits"] for u in x["uses"] if _use(name, u) in want)
    total = sum(x["compile_s"] for x in rep)
    assert len(rep) < 400, f"{len(rep)} launches compiled ({total:.0f} s): the deduplication by specialization failed"


def _planted(tmp_path) -> Path:
    """kernels/small_mma.py with its wait taken only when it splits."""
    src = (ROOT / "kernels" / "small_mma.py").read_text()
    old = "    if PDL:\n        # launched with programmatic dependent launch after this call's quantize kernel"
    assert src.count(old) == 1, "the plant's anchor moved in kernels/small_mma.py"
    f = tmp_path / "small_mma_waits_when_split.py"
    f.write_text(src.replace(old, old.replace("if PDL:", "if PDL and SPLIT > 1:")))
    return f


def test_a_kernel_that_waits_only_when_it_splits_fails(tmp_path):
    """The planted small_mma fails for exactly its single-split launches; 5f06600's list of
    six launches (its small_mma ones both split) passes it."""
    f = _planted(tmp_path)
    rep = _sm90("--module", f"small_mma={f}", "--only", "small_mma")
    assert rep and all(x["module"] == "kernels.small_mma_under_test" for x in rep)
    failed = {x["kernel"] for x in rep if x["violations"]}
    single = {x["kernel"] for x in rep if x["splits"] == 1}
    assert single and failed == single, (f"planted wait-when-split: failed {sorted(failed)[:3]}, single-split "
                                         f"{sorted(single)[:3]}; reproduce: {REPRO} --module small_mma={f}")
    assert all("no griddepcontrol.wait" in x["violations"][-1] for x in rep if x["violations"])
    old = _sm90("--module", f"small_mma={f}", "--old-list", "--only", "small_mma")
    assert len(old) == 2 and all(x["splits"] > 1 and not x["violations"] for x in old), old
