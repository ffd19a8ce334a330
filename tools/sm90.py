"""The decode kernels compiled for sm_90 without a GPU (Triton's compiler for target cuda:90,
ints specialized as the JIT does: divisible by 16, or equal to 1; Triton's bundled cuobjdump),
for two checks that need no GPU:

    python tools/sm90.py loop --n 34816 --k 5120 --m 16 [--module old_small_mma.py] [--config JSON] [--json]
        small_mma's main loop: instructions per trip and warp-instructions per weight byte (a
        decode call's issue budget at 4.6 TB/s is ~0.23; tests/test_sass_budget.py)
    python tools/sm90.py prefill --n 34816 --k 5120 --m 2048 [--config JSON] [--json]
        mmq_wgmma's Gluon kernel: registers, shared memory and its per-group loop (tests/test_mmq_wgmma.py
        holds it to four MMAs a group, no local memory, and three programs an SM)
    python tools/sm90.py pdl [--json]
        every kernel launched with programmatic dependent launch (gemv, small_mma, the quantize
        kernel): no global write and no read of anything but the weights before
        griddepcontrol.wait (pq2verify.ptx; tests/test_pdl_order.py)

Run it with TRITON_INTERPRET unset: the interpreter's kernels do not compile.
"""
import argparse
import collections
import importlib.util
import json
import os
import re
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.experimental.gluon._runtime import GluonASTSource

from pq2verify.cli import existing_file, positive_int
from pq2verify.weights import layout_strides

BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
SMALL_MMA_PTRS = dict(q_ptr="*i8", xs_ptr="*fp32", t_ptr="*i32", codes_ptr="*u8", scales_ptr="*fp16", out_ptr="*bf16",
            part_ptr="*fp32", count_ptr="*i32", dots_ptr="*i32")


def load(path):
    """kernels.small_mma, or another version of that file (e.g. `git show REV:kernels/small_mma.py`)
    loaded as a module of the kernels package, so its relative imports resolve."""
    if path is None:
        from kernels import small_mma
        return small_mma
    import kernels  # noqa: F401  (the package its relative imports name)
    spec = importlib.util.spec_from_file_location("kernels.small_mma_under_test", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def compile_sm90(fn, ptrs: dict, ints: dict, consts: dict, num_warps: int, num_stages: int, **opts):
    """triton.compile of jit (or gluon.jit) function fn for sm_90 as the JIT would specialize a launch with
    pointer arguments of types `ptrs` (16-byte aligned), int arguments `ints` (by value) and
    the constexprs `consts`. Returns (compiled kernel, PTX parameter names in order)."""
    sig, cx, attrs, params = {}, dict(consts), {}, []
    for i, a in enumerate(fn.arg_names):
        if a in ptrs:
            sig[a], attrs[(i,)] = ptrs[a], [["tt.divisibility", 16]]
        elif a in ints and ints[a] == 1:
            sig[a], cx[a] = "constexpr", 1
        elif a in ints:
            sig[a] = "i32"
            if ints[a] % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            sig[a] = "constexpr"
            continue
        if sig[a] != "constexpr":
            params.append(a)
    source = GluonASTSource if getattr(fn, "is_gluon", lambda: False)() else ASTSource
    kern = triton.compile(source(fn, sig, cx, attrs), target=GPUTarget("cuda", 90, 32),
                          options=dict(num_warps=num_warps, num_stages=num_stages, **opts))
    return kern, params


def small_mma_launch(mod, n, k, m, force=None):
    """(config, compile_sm90 arguments) of small_mma's kernel on prepared weights N x K, M rows."""
    cfg = {**mod.config(n, k, m, interpret=False), **(force or {})}
    g = k // 128
    ints = dict(q_sm=k, xs_sm=g, t_sm=g, out_sm=n, out_sn=1, d_sm=0, d_sn=0, d_sg=0, M=m, N=n, G=g,
                **layout_strides(n, k, "prepared"))
    consts = dict(BM=16, BN=cfg["BN"], PER=cfg["groups_per_split"], SPLIT=cfg["SPLIT"], SWAP=cfg["SWAP"],
                  UNROLL=cfg["UNROLL"], PREPARED=True, WRITE_DOTS=False, INTERP=False,
                  MASKED=not (n % cfg["BN"] == 0 and g % cfg["groups_per_split"] == 0), PDL=cfg.get("PDL", False))
    consts = {a: v for a, v in consts.items() if a in mod._small_mma_kernel.arg_names}
    opts = {"maxnreg": cfg["maxnreg"]} if cfg.get("maxnreg") else {}
    return cfg, (mod._small_mma_kernel, SMALL_MMA_PTRS, ints, consts, cfg["num_warps"], cfg["num_stages"]), opts


def gemv_launch(n, k):
    """gemv's kernel on prepared weights N x K (M = 1), as gemv.launch calls it with PDL."""
    from kernels import gemv
    c = gemv.config(n, k, 1, interpret=False)
    g, per, gc = k // 128, c["groups_per_split"], c["GC"]
    ptrs = dict(a_ptr="*i32", xs_ptr="*fp32", t_ptr="*i32", codes_ptr="*i32", scales_ptr="*fp16", out_ptr="*bf16",
                part_ptr="*fp32", count_ptr="*i32", dots_ptr="*i32")
    ints = dict(out_sn=1, d_sn=0, d_sg=0, N=n, G=g, per=per, **layout_strides(n, k, "prepared"))
    consts = dict(BN=c["BN"], GC=gc, LOG_GC=gc.bit_length() - 1, CHUNKS=-(-per // gc), SPLIT=c["SPLIT"],
                  MASKED=not (n % c["BN"] == 0 and per % gc == 0 and g % per == 0), PREPARED=True,
                  WRITE_DOTS=False, PDL=True, INTERP=False)
    return gemv._gemv_kernel, ptrs, ints, consts, c["num_warps"], 1


def quantize_launch(m, k, counters):
    """The Q8 quantize kernel for x [M, K], plane order, zeroing `counters` split-K counters, PDL."""
    from kernels import prepare
    g = k // 128
    bu, warps = prepare._quantize_config(m * g)
    ptrs = dict(x_ptr="*bf16", q_ptr="*i8", s_ptr="*fp32", t_ptr="*i32", zero_ptr="*i32")
    ints = dict(U=m * g, G=g, stride_xm=k, Z=counters)
    consts = dict(BU=bu, PLANE=True, PDL=True, ZB=triton.next_power_of_2(counters) if counters else 0, INTERP=False)
    return prepare._quantize_kernel, ptrs, ints, consts, warps, 1


# (label, launch, pointers that hold weights: constants a PDL kernel may read before its wait)
PDL_KERNELS = [
    ("gemv gate_up 34816x5120", lambda: gemv_launch(34816, 5120), {"codes_ptr", "scales_ptr"}),
    ("gemv down 5120x17408", lambda: gemv_launch(5120, 17408), {"codes_ptr", "scales_ptr"}),
    ("small_mma gate_up M=16", lambda: small_mma_launch(load(None), 34816, 5120, 16)[1], {"codes_ptr", "scales_ptr"}),
    ("small_mma down M=4", lambda: small_mma_launch(load(None), 5120, 17408, 4)[1], {"codes_ptr", "scales_ptr"}),
    ("quantize M=1 K=5120", lambda: quantize_launch(1, 5120, 544), set()),
    ("quantize M=16 K=17408", lambda: quantize_launch(16, 17408, 40), set()),
]


def pdl_report():
    """Per PDL kernel: violations before griddepcontrol.wait with the weights allowed, and the
    global reads there if even the weights were not (what the kernel really prefetches)."""
    from pq2verify import ptx
    out = []
    for label, launch, weights in PDL_KERNELS:
        fn, ptrs, ints, consts, warps, stages = launch()
        assert consts.get("PDL"), f"{label}: not a PDL launch"
        kern, params = compile_sm90(fn, ptrs, ints, consts, warps, stages)
        values = set(params) - set(ptrs)
        entry = fn.__name__
        out.append(dict(kernel=label, entry=entry, module=fn.__module__,
                        violations=ptx.before_wait(kern.asm["ptx"], entry, params, values | weights),
                        reads_of_weights=ptx.before_wait(kern.asm["ptx"], entry, params, values)))
    return out


def wgmma_compile(n, k, m, force=None):
    """(config, compiled) of mmq_wgmma's Gluon kernel for prepared N x K weights and M rows, with
    the descriptors and constexprs run() launches it with (mmq_wgmma.kernel_args), specialized as
    the JIT does."""
    import torch
    from triton.runtime.jit import mangle_type
    from kernels import mmq_wgmma as w
    cfg = w._resolve(n, k, m, False, force)
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
    return cfg, kern


def sass_and_registers(kern):
    """(SASS text, registers per thread) of a compiled kernel, by Triton's bundled cuobjdump."""
    with tempfile.TemporaryDirectory() as d:
        cubin = os.path.join(d, "kernel.cubin")
        with open(cubin, "wb") as f:
            f.write(kern.asm["cubin"])
        dump = [os.path.join(BIN, "cuobjdump"), cubin]
        sass = subprocess.run(dump[:1] + ["-sass"] + dump[1:], capture_output=True, text=True, check=True).stdout
        usage = subprocess.run(dump[:1] + ["-res-usage"] + dump[1:], capture_output=True, text=True, check=True).stdout
    return sass, re.search(r"REG:(\d+)", usage).group(1)


def compile_loop(mod, n, k, m, force=None):
    """(config, SASS, registers) of small_mma's kernel."""
    cfg, args, opts = small_mma_launch(mod, n, k, m, force)
    kern, _ = compile_sm90(*args, **opts)
    return (cfg, *sass_and_registers(kern))


def loops(sass):
    """(first, last, Counter of opcodes) of every backward branch's body."""
    ins = [(int(a, 16), t.strip()) for a, t in re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)]
    at = {a: i for i, (a, _) in enumerate(ins)}
    for i, (a, t) in enumerate(ins):
        b = re.search(r"BRA .*0x([0-9a-f]+)", t)
        if b and int(b.group(1), 16) < a and int(b.group(1), 16) in at:
            body = ins[at[int(b.group(1), 16)]:i + 1]
            yield body[0][0], a, collections.Counter(
                re.sub(r"^@!?U?P\w+\s+", "", x).split()[0].split(".")[0] for _, x in body)


def add_shape_args(parser) -> None:
    """--n, --k, --m of a decode shape to compile (gate_up at M = 16 by default)."""
    parser.add_argument("--n", type=positive_int, default=34816)
    parser.add_argument("--k", type=positive_int, default=5120, help="a multiple of 128")
    parser.add_argument("--m", type=positive_int, default=16, help="1-16")


def shape_error(a, name: str = "small_mma", lo: int = 1, hi: int | None = 16) -> str | None:
    """Why add_shape_args' values cannot be compiled for the kernel `name`, which compiles for
    M in lo..hi (hi None: no bound), or None. small_mma's kernel compiles for M 1-16."""
    if a.k % 128:
        return f"argument --k: expected a multiple of 128 (a Q8 group), got {a.k}"
    if a.m < lo or (hi is not None and a.m > hi):
        return f"argument --m: {name} serves M {f'{lo}+' if hi is None else f'{lo}-{hi}'}, got {a.m}"
    return None


def prefill_report(a, ap):
    from pq2verify import registry
    p = registry.get("mmq_wgmma")
    why = shape_error(a, p.name, p.m_min, p.m_max)
    if why:
        ap.error(why)
    from kernels import mmq_wgmma
    try:
        mmq_wgmma.fold(a.n, a.k, a.m, interpret=False, config=a.config)    # each field checked
    except (ValueError, TypeError) as e:
        ap.error(f"argument --config: {e}")
    cfg, kern = wgmma_compile(a.n, a.k, a.m, a.config)
    sass, regs = sass_and_registers(kern)
    # the per-group loop: the shortest backward branch around the MMAs (an mbarrier wait's retry
    # branch can make a longer one around it)
    body = sorted((dict(first=lo, last=hi, instructions=sum(ops.values()), ops=dict(ops.most_common()))
                   for lo, hi, ops in loops(sass) if ops.get("IGMMA")), key=lambda b: b["instructions"])[:1]
    rep = dict(config=cfg, registers=int(regs), shared=kern.metadata.shared, local=len(re.findall(r"\b(?:LDL|STL)\b", sass)),
               loops=body)
    if a.json:
        print(json.dumps(rep))
        return
    print(f"config {cfg}; {regs} registers, {rep['shared']} bytes of shared memory, {rep['local']} local-memory "
          f"instructions")
    for lp in body:
        print(f"loop {lp['first']:#x}-{lp['last']:#x}: {lp['instructions']} instructions a group and thread; "
              f"{dict(list(lp['ops'].items())[:12])}")


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    lp = sub.add_parser("loop", help="small_mma's loop: instructions per weight byte")
    add_shape_args(lp)
    lp.add_argument("--module", type=existing_file, default=None,
                    help="a small_mma.py to compile instead of kernels/small_mma.py")
    lp.add_argument("--config", type=json.loads, default=None, help='fields over the chooser\'s, e.g. \'{"UNROLL": 2}\'')
    lp.add_argument("--json", action="store_true", help="one JSON object instead of text")
    pp = sub.add_parser("pdl", help="the PDL kernels: nothing but weights touched before griddepcontrol.wait")
    pp.add_argument("--json", action="store_true", help="one JSON object instead of text")
    fp = sub.add_parser("prefill", help="mmq_wgmma's Gluon kernel: registers, shared memory, its loop")
    add_shape_args(fp)
    fp.set_defaults(m=2048)
    fp.add_argument("--config", type=json.loads, default=None, help='fields over the chooser\'s, e.g. \'{"BN": 128}\'')
    fp.add_argument("--json", action="store_true", help="one JSON object instead of text")
    a = ap.parse_args()
    if a.cmd == "prefill":
        return prefill_report(a, ap)
    if a.cmd == "pdl":
        rep = pdl_report()
        if a.json:
            print(json.dumps(rep))
            return
        for r in rep:
            print(f"{r['kernel']}: {'OK' if not r['violations'] else 'VIOLATION'}; "
                  f"{len(r['reads_of_weights'])} weight reads before the wait")
            for v in r["violations"]:
                print("   ", v)
        return
    if shape_error(a):
        ap.error(shape_error(a))
    mod = load(a.module)
    if a.config is not None:
        if not isinstance(a.config, dict):
            ap.error(f"argument --config: expected a JSON object, got {a.config!r}")
        try:
            mod.fold(a.n, a.k, a.m, interpret=False, config=a.config)    # each field checked (pq2verify.tiles)
        except ValueError as e:
            ap.error(f"argument --config: {e}")
    cfg, sass, regs = compile_loop(mod, a.n, a.k, a.m, a.config)
    out = []
    for lo, hi, ops in loops(sass):
        total = sum(ops.values())
        out.append(dict(first=lo, last=hi, instructions=total, ops=dict(ops.most_common()),
                        warp_instructions_per_byte=total * cfg["num_warps"] / (cfg["BN"] * 32 * cfg["UNROLL"])))
    if a.json:
        print(json.dumps(dict(config=cfg, registers=int(regs), loops=out)))
        return
    print(f"config {cfg}; {regs} registers")
    for lp in out:
        print(f"loop {lp['first']:#x}-{lp['last']:#x}: {lp['instructions']} instructions a trip ({cfg['UNROLL']} groups) "
              f"and thread, {lp['warp_instructions_per_byte']:.3f} warp-instructions per weight byte; "
              f"{dict(list(lp['ops'].items())[:12])}")


if __name__ == "__main__":
    main()
