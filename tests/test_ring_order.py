"""mmq_wgmma's TMA ring, ordered in its sm_90 PTX: no stage is refilled while a warp may still
read it.

The Gluon kernel stages each group's operands in an S-deep ring of shared memory and refills
stage g % S with group g + S once group g is folded. A refill issued while another warp still
reads the stage (its activation scales, loaded after the MMA) would feed that warp the next
group's data; on a GPU that shows only when the warps drift apart, which depends on timing. In
the PTX it is certain: over every path of the control-flow graph, each TMA issue
(cp.async.bulk.tensor) must come after a CTA barrier (bar.sync 0) that follows every
shared-memory read (ld.shared, ldmatrix) and every warpgroup MMA's completion (wgmma reads its
shared operands until wgmma.wait_group).

Found while building this: under Triton 3.6 the source-level plant the issue names (the
kernel's gl.thread_barrier() removed) is no fault: the compiler puts a CTA barrier before every
TMA issue of its own, so the compiled ring is still ordered, and a GPU test of that plant could
only pass. The last test records that; should a Triton upgrade drop the compiler's barrier, it
fails and says to add the GPU plant. The checker's power is shown on a PTX-level plant instead
(the barriers deleted from the compiled kernel)."""
import functools
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
STAGES = (2, 4)          # the smallest stage count the config allows, and the chosen one
BARRIER = "        gl.thread_barrier()   # every warp is done with stage g % S before TMA refills it\n"
REPRO = "pytest -p no:randomly tests/test_ring_order.py"

SCRIPT = """
import importlib.util, json, sys
import torch, triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from triton.runtime.jit import mangle_type
import kernels
path, stages = sys.argv[1], [int(s) for s in sys.argv[2].split(",")]
if path == "-":
    from kernels import mmq_wgmma as w
else:
    spec = importlib.util.spec_from_file_location("kernels.mmq_wgmma_under_test", path)
    w = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(w)
n, k, m = 128, 1024, 64
out = {}
for s in stages:
    cfg = w._resolve(n, k, m, False, {"num_stages": s})
    g = k // 128
    descs, cx = w.kernel_args(torch.zeros(m, k, dtype=torch.int8), torch.zeros(n, k // 4, dtype=torch.uint8),
                              torch.zeros(g, -(-m // 4) * 4, dtype=torch.float32)[:, :m], g, cfg, False)
    fn = w._wgmma_kernel
    sig = {a: mangle_type(d) for a, d in descs.items()}
    sig.update(s_ptr="*fp16", y_ptr="*bf16", d_ptr="*i32", M="i32", N="i32", stride_ym="i32", scale_off="i32",
               scale_row="i32")
    sig.update({a: "constexpr" for a in cx})
    attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a in ("s_ptr", "y_ptr", "d_ptr")}
    kern = triton.compile(GluonASTSource(fn, sig, cx, attrs), target=GPUTarget("cuda", 90, 32),
                          options=dict(num_warps=cx["num_warps"], num_stages=1))
    out[s] = kern.asm["ptx"]
print(json.dumps(out))
"""


def _compile(path: str = "-") -> dict[int, str]:
    """{stages: PTX} of mmq_wgmma's Gluon kernel (or the file at `path`), as pq2verify.sm90
    compiles it (a subprocess: the suite's interpreter mode does not compile)."""
    cmd = [sys.executable, "-c", SCRIPT, path, ",".join(map(str, STAGES))]
    r = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "TRITON_INTERPRET": "0"}, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, f"compiling mmq_wgmma for sm_90 failed: {r.stderr[-2000:]}"
    return {int(s): p for s, p in json.loads(r.stdout).items()}


@functools.cache
def _real() -> dict[int, str]:
    return _compile()


# --- the check ------------------------------------------------------------------------------
_LABEL = re.compile(r"^(\$L\w+):")
_BRANCH = re.compile(r"^(@!?%\w+\s+)?bra(\.uni)?\s+(\$L\w+)\s*;")
_FULL_BARRIER = re.compile(r"^(bar|barrier)(\.cta)?(\.aligned)?\.sync(\.aligned)?\s+0\s*;")
_READ = re.compile(r"^(@!?%\w+\s+)?(ld\.shared|ldmatrix)")


def _blocks(ptx: str):
    """The entry's basic blocks: [(label or None, statements)], and successors by index."""
    body = ptx[ptx.index(".entry"):]
    body = body[body.index("\n{") + 2:]
    blocks, cur, depth = [], (None, []), 0
    for raw in body.splitlines():
        line = raw.split("//")[0].strip()
        depth += line.count("{") - line.count("}")     # inline-asm scopes; below 0: the entry's end
        if depth < 0:
            break
        m = _LABEL.match(line)
        if m:
            blocks.append(cur)
            cur = (m.group(1), [])
            continue
        if line and not line.startswith("."):
            cur[1].append(line)
            if _BRANCH.match(line) or line.startswith(("ret", "exit")):
                blocks.append(cur)
                cur = (None, [])
    blocks.append(cur)
    index = {lab: i for i, (lab, _) in enumerate(blocks) if lab}
    succ = []
    for i, (_, stmts) in enumerate(blocks):
        last = stmts[-1] if stmts else ""
        b = _BRANCH.match(last)
        nxt = [i + 1] if i + 1 < len(blocks) else []
        if b and b.group(3) in index:
            succ.append([index[b.group(3)]] + (nxt if b.group(1) else []))
        elif last.startswith(("ret", "exit")):
            succ.append([])
        else:
            succ.append(nxt)
    return blocks, succ


def _step(state, stmt):
    """(a shared read may be unfenced, a wgmma may be outstanding) after one statement."""
    read, mma = state
    if "wgmma.mma_async" in stmt:
        return True, True
    if stmt.startswith("wgmma.wait_group") and re.search(r"\s0\s*;", stmt):
        return read, False
    if _FULL_BARRIER.match(stmt):
        return read and mma, mma
    if _READ.match(stmt):
        return True, mma
    return read, mma


def unfenced_refills(ptx: str) -> tuple[list[str], int]:
    """(violations, TMA issues checked): each TMA issue reachable on some path from a
    shared-memory read or an outstanding wgmma without a full CTA barrier in between."""
    blocks, succ = _blocks(ptx)
    state_in = [(False, False)] + [None] * (len(blocks) - 1)
    work = [0]
    while work:                                      # forward may-analysis to a fixed point
        i = work.pop()
        s = state_in[i]
        for stmt in blocks[i][1]:
            s = _step(s, stmt)
        for j in succ[i]:
            old = state_in[j]
            new = s if old is None else (old[0] or s[0], old[1] or s[1])
            if new != old:
                state_in[j] = new
                work.append(j)
    bad, issues = [], 0
    for i, (label, stmts) in enumerate(blocks):
        s = state_in[i]
        if s is None:
            continue
        for stmt in stmts:
            if "cp.async.bulk.tensor" in stmt:
                issues += 1
                if s[0] or s[1]:
                    bad.append(f"{label or f'block {i}'}: {stmt[:90]} (a shared read {'or wgmma ' if s[1] else ''}"
                               f"may be unfenced)")
            s = _step(s, stmt)
    return bad, issues


# --- tests ------------------------------------------------------------------------------------
@pytest.mark.parametrize("stages", STAGES)
def test_every_refill_follows_a_barrier_after_the_stage_is_read(stages):
    """The real kernel at 2 and 4 stages: every TMA issue, prologue and refills, is fenced; the
    loop's refills are among those checked (three copies a refill, plus the prologue's)."""
    ptx = _real()[stages]
    bad, issues = unfenced_refills(ptx)
    assert not bad, f"mmq_wgmma S={stages}: a ring stage refilled while it may still be read: {bad[:3]}; reproduce: {REPRO}"
    assert issues >= 3 * (min(stages, 8) + 1), f"mmq_wgmma S={stages}: only {issues} TMA issues seen"
    assert "ld.shared" in ptx and "wgmma.mma_async" in ptx


@pytest.mark.parametrize("stages", STAGES)
def test_a_refill_without_its_barrier_is_caught(stages):
    """The checker's power: the compiled kernel with every full CTA barrier deleted refills a
    stage its warps may still read (the scales' ld.shared, the wgmma's operands)."""
    ptx = "\n".join(ln for ln in _real()[stages].splitlines() if not _FULL_BARRIER.match(ln.split("//")[0].strip()))
    bad, _ = unfenced_refills(ptx)
    assert bad, f"mmq_wgmma S={stages} without barriers passed the ring check; reproduce: {REPRO}"


def test_a_wgmma_still_reading_is_not_fenced_by_a_barrier():
    """A barrier before the wgmma's wait does not end its reads of shared memory."""
    ptx = """.visible .entry k()
{
	wgmma.mma_async.sync.aligned.m64n64k32.s32.s8.s8 {%r1}, %rd1, %rd2, p;
	bar.sync 	0;
	cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%r2], [%rd3, {%r3, %r4}], [%r5];
	wgmma.wait_group.sync.aligned 0;
	bar.sync 	0;
	cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%r2], [%rd3, {%r3, %r4}], [%r5];
	ret;
}
"""
    bad, issues = unfenced_refills(ptx)
    assert issues == 2 and len(bad) == 1 and "wgmma" in bad[0], bad


def test_a_branch_around_the_barrier_is_caught():
    """The check follows every path: a barrier skipped by a branch does not fence."""
    ptx = """.visible .entry k()
{
	ld.shared.b32 	%r1, [%r2];
	@%p1 bra 	$L__BB0_2;
	bar.sync 	0;
$L__BB0_2:
	cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%r2], [%rd3, {%r3, %r4}], [%r5];
	ret;
}
"""
    bad, _ = unfenced_refills(ptx)
    assert len(bad) == 1, bad
    assert not unfenced_refills(ptx.replace("\t@%p1 bra \t$L__BB0_2;\n", ""))[0]


def test_the_source_plant_is_no_fault_under_this_triton(tmp_path):
    """mmq_wgmma with its gl.thread_barrier() removed still compiles to a fenced ring: the
    compiler fences each TMA issue itself. If this fails, the compiler stopped doing so and the
    source barrier is load-bearing: add a GPU test that runs this plant at 2 stages with the
    warps delayed apart, and expect it to fail every time."""
    src = (ROOT / "kernels" / "mmq_wgmma.py").read_text()
    assert src.count(BARRIER) == 1, "the plant's anchor moved in kernels/mmq_wgmma.py"
    f = tmp_path / "mmq_wgmma_no_barrier.py"
    f.write_text(src.replace(BARRIER, ""))
    planted = _compile(str(f))
    for s in STAGES:
        assert planted[s] != _real()[s], f"S={s}: removing gl.thread_barrier() changed nothing in the PTX"
        bad, issues = unfenced_refills(planted[s])
        assert not bad and issues, (f"S={s}: without gl.thread_barrier() the compiled ring is unfenced: {bad[:2]}. "
                                    "The source barrier is now load-bearing: add the GPU plant (see the docstring)")
