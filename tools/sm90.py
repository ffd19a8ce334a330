"""The decode kernels compiled for sm_90 without a GPU (Triton's compiler for target cuda:90,
ints specialized as the JIT does: divisible by 16, or equal to 1; Triton's bundled cuobjdump),
for two checks that need no GPU:

    python tools/sm90.py loop --n 34816 --k 5120 --m 16 [--module old_small_mma.py] [--config JSON] [--json]
        small_mma's main loop: instructions per trip and warp-instructions per weight byte (a
        decode call's issue budget at 4.6 TB/s is ~0.23; tests/test_sass_budget.py)
    python tools/sm90.py prefill --n 34816 --k 5120 --m 2048 [--config JSON] [--json]
        mmq_wgmma's Gluon kernel: registers, shared memory and its per-group loop (tests/test_mmq_wgmma.py
        holds it to four MMAs a group, no local memory, and three programs an SM)
    python tools/sm90.py pdl [--json] [--module small_mma=FILE] [--old-list]
        every kernel launched with programmatic dependent launch (gemv, small_mma, the quantize
        kernel), once per compiled specialization, for every shape and M the bench, the GPU
        check and the GSM8K model run (single-split included): no global write and no read of
        anything but the weights before griddepcontrol.wait (pq2verify.ptx;
        tests/test_pdl_order.py); exit 1 on a violation
    python tools/sm90.py resources [--json] [--only PATHS] [--config PATH=JSON] [--model] [--table F] [--record F]
        the resource gate: every config the choosers return for the bonsai27b shapes at the
        bench's and the check's Ms (--model: the GSM8K model's too), once per compiled
        specialization: registers, local memory (spills), shared memory and programs per SM
        (pq2verify.resources), against pq2verify/verified/resources-sm90.json; exit 1 on a
        spill, an occupancy below the recorded one, or a specialization not recorded
        (tests/test_resource_gate.py); --record F writes the table instead of judging

Run it with TRITON_INTERPRET unset: the interpreter's kernels do not compile.
"""
import argparse
import collections
import functools
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.experimental.gluon._runtime import GluonASTSource

from pq2verify.cli import UsageError, existing_file, positive_int
from pq2verify.weights import layout_strides

BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
SMALL_MMA_PTRS = dict(q_ptr="*i8", xs_ptr="*fp32", t_ptr="*i32", codes_ptr="*u8", scales_ptr="*fp16", out_ptr="*bf16",
            part_ptr="*fp32", count_ptr="*i32", dots_ptr="*i32")


def load(path, name: str = "small_mma"):
    """kernels.<name> (small_mma by default), or another version of that file (e.g. `git show
    REV:kernels/small_mma.py`) loaded as a module of the kernels package, so its relative
    imports resolve."""
    if path is None:
        return importlib.import_module(f"kernels.{name}")
    import kernels  # noqa: F401  (the package its relative imports name)
    spec = importlib.util.spec_from_file_location(f"kernels.{name}_under_test", path)
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


def small_mma_launch(mod, n, k, m, force=None, dtype="bf16", layout="prepared"):
    """(config, compile_sm90 arguments, options) of small_mma's kernel on N x K weights in
    `layout`, M rows of `dtype`, as run() launches it."""
    cfg = {**mod.config(n, k, m, interpret=False), **(force or {})}
    g = k // 128
    split, out = cfg["SPLIT"], f"*{dtype}"
    # run(): partials and counters only when it splits (else out and the sums stand in), and
    # out for the dots it does not write
    ptrs = {**SMALL_MMA_PTRS, "out_ptr": out, "dots_ptr": out}
    if split == 1:
        ptrs.update(part_ptr=out, count_ptr="*i32")
    prepared = layout == "prepared"
    ints = dict(q_sm=k, xs_sm=g, t_sm=g, out_sm=n, out_sn=1, d_sm=0, d_sn=0, d_sg=0, M=m, N=n, G=g,
                **layout_strides(n, k, layout))
    consts = dict(BM=16, BN=cfg["BN"], PER=cfg["groups_per_split"], SPLIT=split, SWAP=cfg["SWAP"],
                  UNROLL=cfg["UNROLL"], PREPARED=prepared, WRITE_DOTS=False, INTERP=False,
                  MASKED=not (prepared and n % cfg["BN"] == 0 and g % cfg["groups_per_split"] == 0),
                  PDL=cfg.get("PDL", False))
    consts = {a: v for a, v in consts.items() if a in mod._small_mma_kernel.arg_names}
    opts = {"maxnreg": cfg["maxnreg"]} if cfg.get("maxnreg") else {}
    return cfg, (mod._small_mma_kernel, ptrs, ints, consts, cfg["num_warps"], cfg["num_stages"]), opts


def gemv_launch(n, k, mod=None, dtype="bf16", layout="prepared", force=None):
    """(config, compile_sm90 arguments, options) of gemv's kernel on N x K weights in `layout`
    (M = 1), as gemv.run() launches it (PDL as its config says); force: fields over the
    chooser's."""
    if mod is None:
        from kernels import gemv as mod
    c = {**mod.config(n, k, 1, interpret=False), **(force or {})}
    g, per, gc, split = k // 128, c["groups_per_split"], c["GC"], c["SPLIT"]
    prepared, out = layout == "prepared", f"*{dtype}"
    ptrs = dict(a_ptr="*i32", xs_ptr="*fp32", t_ptr="*i32", codes_ptr="*i32" if prepared else "*u8",
                scales_ptr="*fp16", out_ptr=out, part_ptr="*fp32" if split > 1 else out, count_ptr="*i32",
                dots_ptr=out)
    ints = dict(out_sn=1, d_sn=0, d_sg=0, N=n, G=g, per=per, **layout_strides(n, k, layout))
    consts = dict(BN=c["BN"], GC=gc, LOG_GC=gc.bit_length() - 1, CHUNKS=-(-per // gc), SPLIT=split,
                  MASKED=not (prepared and n % c["BN"] == 0 and per % gc == 0 and g % per == 0), PREPARED=prepared,
                  WRITE_DOTS=False, PDL=c["PDL"], INTERP=False)
    return c, (mod._gemv_kernel, ptrs, ints, consts, c["num_warps"], 1), {}


def quantize_launch(m, k, counters, dtype="bf16"):
    """The Q8 quantize kernel for x [M, K] of `dtype`, plane order, PDL, zeroing `counters`
    split-K counters (0: the consumer does not split; prepare.quantize_q8 then passes the sums)."""
    from kernels import prepare
    g = k // 128
    bu, warps = prepare._quantize_config(m * g)
    ptrs = dict(x_ptr=f"*{dtype}", q_ptr="*i8", s_ptr="*fp32", t_ptr="*i32", zero_ptr="*i32")
    ints = dict(U=m * g, G=g, stride_xm=k, Z=counters)
    consts = dict(BU=bu, PLANE=True, PDL=True, ZB=triton.next_power_of_2(counters) if counters else 0, INTERP=False)
    return {}, (prepare._quantize_kernel, ptrs, ints, consts, warps, 1), {}


# Pointers that hold weights: constants a PDL kernel may read before its wait.
WEIGHTS = {"gemv": {"codes_ptr", "scales_ptr"}, "small_mma": {"codes_ptr", "scales_ptr"}, "quantize": set()}
# The PDL-launching paths: name -> (N, K, M, dtype, layout, module) -> (config, compile args, options)
PDL_PATHS = {
    "gemv": lambda n, k, m, dtype, layout, mod: gemv_launch(n, k, mod, dtype, layout),
    "small_mma": lambda n, k, m, dtype, layout, mod: small_mma_launch(mod or load(None), n, k, m, None, dtype, layout),
}
# commit 5f06600's list (tests/test_pdl_order.py shows what it misses): (path, N, K, M)
OLD_PDL_LIST = [("gemv", 34816, 5120, 1), ("gemv", 5120, 17408, 1), ("small_mma", 34816, 5120, 16),
                ("small_mma", 5120, 17408, 4)]


@functools.cache
def model_shapes() -> list[tuple[str, int, int]]:
    """(label, N, K) of every PQ2 matrix the GSM8K model (SmolLM2-135M's config,
    tools/model_determinism.py) runs, as pq2verify.gsm8k.model converts it: siblings stacked
    along N, K padded to whole groups, times the digits (4 by default, 1 for a ternary
    checkpoint). Built on the meta device: shapes only."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from model_determinism import CONFIG
    from pq2verify.gsm8k import convert, model as mdl
    with torch.device("meta"):
        net = LlamaForCausalLM(LlamaConfig(**{**CONFIG, "num_hidden_layers": 1}))
    out = []
    for parent, names in mdl._linear_groups(net):
        mods = [getattr(parent, x) for x in names]
        kp = convert.pad_k(torch.empty(1, mods[0].in_features, device="meta")).shape[1]
        for digits in (4, 1):
            out.append((f"gsm8k:{'+'.join(names)}x{digits}", sum(x.out_features for x in mods), digits * kp))
    return out


def run_shapes(model: bool = True) -> list[tuple[str, int, int, tuple]]:
    """(label, N, K, Ms) of every PQ2 call the bench, the GPU check and the GSM8K model make:
    the bonsai27b shapes at the bench's Ms (step and shape rows) and the check's; the model's
    at every decode M (rows still generating, 1..16) and its prefill (17+: no PDL path); not
    the model's unless `model`."""
    from pq2verify import bench, cases
    ms = tuple(sorted(set(bench.STEP_MS) | set(bench.DEFAULT_MS) | set(cases.MS["bonsai27b"])))
    out = [(f"bonsai27b:{s}", n, k, ms) for s, n, k in cases.SHAPES["bonsai27b"]["pq2"]]
    return out + [(label, n, k, tuple(range(1, 18))) for label, n, k in (model_shapes() if model else [])]


def specialization(fn, ptrs, ints, consts, warps, stages, opts) -> tuple:
    """What the JIT compiles one binary per: the function, its argument types, the ints equal
    to 1 or divisible by 16, the constexprs and the launch options."""
    key = [fn.__module__, fn.__name__, warps, stages, tuple(sorted(opts.items()))]
    for a in fn.arg_names:
        if a in ptrs:
            key.append((a, ptrs[a]))
        elif a in ints:
            v = ints[a]
            key.append((a, "1" if v == 1 else "D" if v % 16 == 0 else "i32"))
        else:
            key.append((a, repr(consts.get(a))))
    return tuple(key)


def pdl_launches(modules: dict | None = None) -> list[dict]:
    """Every distinct PDL launch (one per compiled specialization) of the PDL paths and their
    quantize kernel for run_shapes(), every M a PDL path serves, both dtypes and its layouts,
    single-split included: [{label, uses, splits, launch: (fn, ptrs, ints, consts, warps,
    stages), opts, weights}]. modules: path name -> a kernel file's module to compile instead."""
    from pq2verify import registry
    modules = modules or {}
    found: dict[tuple, dict] = {}

    def add(label, use, cfg, args, opts, weights):
        key = specialization(*args, opts)
        e = found.setdefault(key, dict(label=label, uses=[], splits=cfg.get("SPLIT", 1), launch=args, opts=opts,
                                       weights=weights))
        e["uses"].append(use)
    for shape, n, k, ms in run_shapes():
        for name, build in PDL_PATHS.items():
            p = registry.get(name)
            for m in ms:
                if not p.serves(m):
                    continue
                for dtype in ("bf16", "fp16"):
                    for layout in p.layouts:
                        cfg, args, opts = build(n, k, m, dtype, layout, modules.get(name))
                        if not cfg.get("PDL"):
                            continue      # launched plainly: no order to prove
                        use = f"{shape} {n}x{k} M={m} {dtype} {layout}"
                        split = cfg["SPLIT"]
                        add(f"{name} {use} SPLIT={split}", use, cfg, args, opts, WEIGHTS[name])
                        # its quantize kernel, zeroing the row tiles' counters when it splits
                        counters = -(-n // cfg["BN"]) if split > 1 else 0
                        qc, qargs, qopts = quantize_launch(m, k, counters, dtype)
                        add(f"quantize {use} counters={counters}", use, {}, qargs, qopts, WEIGHTS["quantize"])
    return list(found.values())


def old_pdl_launches(modules: dict | None = None) -> list[dict]:
    """OLD_PDL_LIST's launches (bf16, prepared) and its two quantize launches, as 5f06600's
    tools/sm90.py built them."""
    modules = modules or {}
    out = []
    for name, n, k, m in OLD_PDL_LIST:
        cfg, args, opts = PDL_PATHS[name](n, k, m, "bf16", "prepared", modules.get(name))
        out.append(dict(label=f"{name} {n}x{k} M={m}", uses=["old list"], splits=cfg["SPLIT"], launch=args,
                        opts=opts, weights=WEIGHTS[name]))
    for m, k, z in ((1, 5120, 544), (16, 17408, 40)):
        _, args, opts = quantize_launch(m, k, z)
        out.append(dict(label=f"quantize M={m} K={k}", uses=["old list"], splits=1, launch=args, opts=opts,
                        weights=set()))
    return out


def pdl_report(modules: dict | None = None, old: bool = False, only: set | None = None):
    """Per distinct PDL launch: violations before griddepcontrol.wait with the weights allowed,
    the global reads there if even the weights were not (what the kernel really prefetches),
    and the compile's seconds. only: the kernels to compile (gemv, small_mma, quantize; None: all)."""
    import time
    from pq2verify import ptx
    out = []
    for e in (old_pdl_launches if old else pdl_launches)(modules):
        if only and e["label"].split()[0] not in only:
            continue
        fn, ptrs, ints, consts, warps, stages = e["launch"]
        assert consts.get("PDL"), f"{e['label']}: not a PDL launch"
        t0 = time.perf_counter()
        kern, params = compile_sm90(fn, ptrs, ints, consts, warps, stages, **e["opts"])
        dt = time.perf_counter() - t0
        values = set(params) - set(ptrs)
        entry = fn.__name__
        out.append(dict(kernel=e["label"], entry=entry, module=fn.__module__, splits=e["splits"], uses=e["uses"],
                        compile_s=round(dt, 3),
                        violations=ptx.before_wait(kern.asm["ptx"], entry, params, values | e["weights"]),
                        reads_of_weights=ptx.before_wait(kern.asm["ptx"], entry, params, values)))
    return out


def wgmma_compile(n, k, m, force=None, dtype="bf16"):
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
    sig.update(s_ptr="*fp16", y_ptr=f"*{dtype}", d_ptr="*i32", M="i32", N="i32", stride_ym="i32", scale_off="i32",
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


# --- the resource gate: every config the choosers return, compiled; pq2verify.resources judges

def _q8_launch(fn, ptrs, n, k, m, dtype, layout, cfg, consts):
    """int_gemv's, mmq's and native's launches: weights at `layout`'s strides, M x N output."""
    ints = dict(M=m, N=n, stride_ym=n, stride_xm=k, **layout_strides(n, k, layout))
    ints = {a: v for a, v in ints.items() if a in fn.arg_names}
    consts = {a: v for a, v in consts.items() if a in fn.arg_names}
    return cfg, (fn, ptrs, ints, consts, cfg["num_warps"], cfg["num_stages"]), {}


def _int_gemv(n, k, m, dtype, layout, cfg):
    from kernels import int_gemv as mod
    out = f"*{dtype}"
    ptrs = dict(qw_ptr="*i32", xs_ptr="*fp32", c_ptr="*u8", s_ptr="*fp16", y_ptr=out, d_ptr=out)
    return _q8_launch(mod._gemv_kernel, ptrs, n, k, m, dtype, layout, cfg,
                      dict(G=k // 128, BM=cfg["BM"], BN=cfg["BN"], GB=cfg["GB"], DOTS=False, INTERP=False))


def _mmq(n, k, m, dtype, layout, cfg):
    from kernels import mmq as mod
    out = f"*{dtype}"
    ptrs = dict(q_ptr="*i8", xs_ptr="*fp32", c_ptr="*u8", s_ptr="*fp16", y_ptr=out, d_ptr=out)
    return _q8_launch(mod._mmq_kernel, ptrs, n, k, m, dtype, layout, cfg,
                      dict(G=k // 128, BM=cfg["BM"], BN=cfg["BN"], DOTS=False, INTERP=False))


def _native(n, k, m, dtype, layout, cfg):
    from kernels import native as mod
    out = f"*{dtype}"
    ptrs = dict(x_ptr=out, c_ptr="*u8", s_ptr="*fp16", y_ptr=out)
    return _q8_launch(mod._native_kernel, ptrs, n, k, m, dtype, layout, cfg,
                      dict(G=k // 128, BM=cfg["BM"], BN=cfg["BN"], INTERP=False))


def _single(n, k, m, dtype, layout, cfg):
    from kernels import single as mod
    g, out, prepared = k // 128, f"*{dtype}", layout == "prepared"
    bn, gc, per, split = cfg["BN"], cfg["GC"], cfg["groups_per_split"], cfg["SPLIT"]
    ptrs = dict(a_ptr="*i32", xs_ptr="*fp32", t_ptr="*i32", codes_ptr="*i32" if prepared else "*u8",
                scales_ptr="*fp16", out_ptr=out, part_ptr="*fp32" if split > 1 else out, dots_ptr=out)
    ints = dict(out_sn=1, d_sn=0, d_sg=0, N=n, G=g, groups_per_split=per, **layout_strides(n, k, layout))
    consts = dict(BN=bn, GC=gc, LOG_GC=gc.bit_length() - 1, CHUNKS=-(-per // gc), SPLIT=split,
                  PREFETCH=cfg["PREFETCH"], PREPARED=prepared, WRITE_DOTS=False, INTERP=False)
    return cfg, (mod._single_kernel, ptrs, ints, consts, cfg["num_warps"], cfg["num_stages"]), {}


def _small_gemm(n, k, m, dtype, layout, cfg):
    from kernels import small_gemm as mod
    out, split = f"*{dtype}", cfg["SPLIT"]
    ptrs = dict(x_ptr=out, w_ptr=out, out_ptr=out, part_ptr="*fp32" if split > 1 else out)
    ints = dict(x_sm=k, x_sk=1, w_sn=k, w_sk=1, out_sm=n, out_sn=1, M=m, N=n, K=k)
    consts = dict(BM=16, BN=cfg["BN"], BK=cfg["BK"], STEPS=cfg["k_per_split"] // cfg["BK"], SPLIT=split, INTERP=False)
    return cfg, (mod._small_gemm_kernel, ptrs, ints, consts, cfg["num_warps"], cfg["num_stages"]), {}


def _mmq_planes(n, k, m, dtype, layout, cfg):
    from kernels import mmq_planes as mod
    g, out = k // 128, f"*{dtype}"
    ptrs = dict(q_ptr="*i8", xs_ptr="*fp32", t_ptr="*i32", codes_ptr="*u8", scales_ptr="*fp16", out_ptr=out,
                dots_ptr=out)
    ints = dict(q_sm=k, xs_sm=g, t_sm=g, out_sm=n, out_sn=1, d_sm=0, d_sn=0, d_sg=0, M=m, N=n,
                **layout_strides(n, k, layout))
    consts = dict(BM=cfg["BM"], BN=cfg["BN"], G=g, SWAP=cfg["SWAP"], PREPARED=layout == "prepared",
                  WRITE_DOTS=False, INTERP=False)
    return cfg, (mod._mmq_planes_kernel, ptrs, ints, consts, cfg["num_warps"], cfg["num_stages"]), {}


# path -> (N, K, M, dtype, layout, resolved config) -> (config, compile_sm90 arguments, options),
# as that path's run() launches its matrix kernel on sm_90 (mmq_wgmma: its Gluon kernel)
RESOURCE_PATHS = {
    "native": _native, "int_gemv": _int_gemv, "mmq": _mmq, "single": _single, "small_gemm": _small_gemm,
    "mmq_planes": _mmq_planes,
    "gemv": lambda n, k, m, dtype, layout, cfg: gemv_launch(n, k, None, dtype, layout, force=cfg),
    "small_mma": lambda n, k, m, dtype, layout, cfg: small_mma_launch(load(None), n, k, m, cfg, dtype, layout),
    "mmq_wgmma": None,
}
_COMPILED: dict = {}


def compile_cached(key, build):
    """build() (a compile) once per key in this process; Triton's own cache spans processes
    (tests/test_pdl_order.py's compiles of the same launches are hits here)."""
    if key not in _COMPILED:
        import time
        t0 = time.perf_counter()
        kern = build()
        _COMPILED[key] = (kern, time.perf_counter() - t0)
    return _COMPILED[key]


def resource_usage(kern) -> dict:
    """{registers, local, static_shared} of a compiled kernel's cubin, by cuobjdump -res-usage:
    registers a thread, local memory a thread in bytes (spills; stack included), and static
    shared memory (on sm_90 the 1 KB the system reserves a block)."""
    with tempfile.TemporaryDirectory() as d:
        cubin = os.path.join(d, "kernel.cubin")
        with open(cubin, "wb") as f:
            f.write(kern.asm["cubin"])
        usage = subprocess.run([os.path.join(BIN, "cuobjdump"), "-res-usage", cubin], capture_output=True,
                               text=True, check=True).stdout
    f = dict(re.findall(r"\b(REG|STACK|SHARED|LOCAL):(\d+)", usage))
    return dict(registers=int(f["REG"]), local=int(f["LOCAL"]) + int(f["STACK"]), static_shared=int(f["SHARED"]))


def _variant(args: tuple, cfg: dict) -> str:
    """The part of a specialization the config does not name: the ints' classes in argument
    order (1, D divisible by 16, i other) and the other constexprs (G, MASKED, ...)."""
    fn, ptrs, ints, consts = args[:4]
    cls = "".join("1" if ints[a] == 1 else "D" if ints[a] % 16 == 0 else "i" for a in fn.arg_names if a in ints)
    cx = [f"{a}={consts[a]}" for a in fn.arg_names
          if a in consts and a not in cfg and a not in ("INTERP", "WRITE_DOTS", "DOTS")]
    return " ".join(cx + ["ints=" + cls])


def resource_launches(force: dict | None = None, only: set | None = None, model: bool = False) -> list[dict]:
    """Every distinct compiled specialization of the paths' matrix kernels (RESOURCE_PATHS: every
    Triton path of pq2verify.registry) for the calls the bench and the GPU check make: the
    bonsai27b shapes (run_shapes(); the dense path on the dense ones) at the bench's and the
    check's Ms, both dtypes and each layout the path serves; model: the GSM8K model's shapes too.
    [{kernel, config, variant, key, uses, build}], build() the compile. force: path -> fields over
    its chooser's config (a ValueError if the path's fold refuses them); only: the paths to
    include."""
    from pq2verify import cases, registry
    force = force or {}
    found: dict[tuple, dict] = {}
    pq2 = run_shapes(model)
    dense = [(f"bonsai27b:{s}", n, k, pq2[0][3]) for s, n, k in cases.SHAPES["bonsai27b"]["dense"]]
    for name, build in RESOURCE_PATHS.items():
        if only and name not in only:
            continue
        p = registry.get(name)
        mod = importlib.import_module(p.module)
        for shape, n, k, ms in (dense if p.weight == "dense" else pq2):
            for m in ms:
                if not p.serves(m):
                    continue
                if name in force:
                    mod.fold(n, k, m, interpret=False, config=force[name])   # each field checked
                cfg = {**mod.config(n, k, m, interpret=False), **force.get(name, {})}
                for dtype in ("bf16", "fp16"):
                    for layout in p.layouts:
                        use = f"{shape} {n}x{k} M={m} {dtype} {layout}"
                        if build is None:          # mmq_wgmma: the Gluon kernel's own compile
                            c = {**mod._resolve(n, k, m, False, force.get(name)), "num_warps": cfg["BN"] // 16}
                            spec = ("mmq_wgmma", dtype, tuple(sorted(c.items())), k // 128)
                            variant = f"G={k // 128}"
                            thunk = (lambda n=n, k=k, m=m, f=force.get(name), dt=dtype:
                                     wgmma_compile(n, k, m, f, dt)[1])
                            warps = c["num_warps"]
                        else:
                            c, args, opts = build(n, k, m, dtype, layout, cfg)
                            full = specialization(*args, opts)
                            spec = (name, dtype) + full[2:]    # not the module: a planted file keeps its keys
                            variant = _variant(args, c)
                            thunk = (lambda args=args, opts=opts: compile_sm90(*args, **opts)[0])
                            warps = args[4]
                        e = found.get(spec)
                        if e is None:
                            cs = " ".join(f"{a}={v}" for a, v in sorted(c.items()))
                            e = found[spec] = dict(kernel=name, config=c, variant=f"{dtype} {layout} {variant}",
                                                   key=f"{name} {cs} | {dtype} {layout} {variant}", uses=[],
                                                   num_warps=warps, build=thunk, spec=spec)
                        e["uses"].append(use)
    return list(found.values())


def resources_report(force: dict | None = None, only: set | None = None, recorded: dict | None = None,
                     model: bool = False) -> list[dict]:
    """resource_launches() compiled: each with registers, local memory, static and dynamic shared
    memory, programs per SM and the binding limit (pq2verify.resources.occupancy), the compile's
    seconds, and with `recorded` given the recorded value and the verdict."""
    from pq2verify import resources
    rows = []
    for e in resource_launches(force, only, model):
        kern, dt = compile_cached(e["spec"], e["build"])
        use = resource_usage(kern)
        programs, limit = resources.occupancy(use["registers"], kern.metadata.shared, e["num_warps"],
                                              use["static_shared"])
        rows.append(dict(kernel=e["kernel"], config=e["config"], variant=e["variant"], key=e["key"], uses=e["uses"],
                         num_warps=e["num_warps"], **use, shared=kern.metadata.shared, programs=programs, limit=limit,
                         compile_s=round(dt, 3)))
    return rows if recorded is None else resources.gate(rows, recorded)


LIMIT = {"registers": "regs", "shared": "smem", "warps": "warp", "blocks": "blks"}


def resources_main(a, ap):
    from pq2verify import outputs, resources
    force = {}
    for spec in a.config:
        name, eq, text = spec.partition("=")
        if not eq or name not in RESOURCE_PATHS:
            ap.error(f"argument --config: expected PATH=JSON with PATH one of {', '.join(RESOURCE_PATHS)}, "
                     f"got {spec!r}")
        if name in force:
            ap.error(f"argument --config: {name} given twice")
        try:
            force[name] = json.loads(text)
        except json.JSONDecodeError as e:
            ap.error(f"argument --config: {name}: not JSON: {e}")
        if not isinstance(force[name], dict):
            ap.error(f"argument --config: {name}: expected a JSON object, got {text!r}")
    only = None
    if a.only is not None:
        only = set(a.only.split(","))
        if not a.only or only - set(RESOURCE_PATHS):
            ap.error(f"argument --only: expected names from {', '.join(RESOURCE_PATHS)}, got {a.only!r}")
    recording = a.record is not None
    if recording and (only or force):
        ap.error("argument --record: records the whole table; not with --only or --config")
    if recording:
        a.model = True          # the table holds both runs' specializations
    recorded = {}
    if not recording:
        try:
            recorded = resources.load(a.table)
        except ValueError as e:
            ap.error(f"argument --table: {e}")
    try:
        outputs.check(outputs=[("--record", a.record)] if recording else [],
                      inputs=[("--table", a.table)] if not recording else [])
    except UsageError as e:     # the option is named
        ap.error(str(e))
    try:
        resource_launches(force, only, a.model)   # forced fields checked before any compile
    except (ValueError, TypeError) as e:
        ap.error(f"argument --config: {e}")
    rows = resources_report(force, only, recorded, a.model)
    if recording:
        text = resources.record(rows)
        if a.json:
            print(json.dumps(rows))
        outputs.write_text(a.record, text, "--record")
        print(f"{len(rows)} specializations recorded in {a.record}", file=sys.stderr if a.json else sys.stdout)
        return 0
    bad = [r for r in rows if not resources.passed(r["verdict"])]
    if a.json:
        print(json.dumps(rows))
        return 1 if bad else 0
    print(f"{'kernel':<11} {'config | variant':<70} {'regs':>4} {'spill B':>7} {'shared KB':>9} {'prog/SM':>7} "
          f"{'recorded':>8}  verdict")
    for r in rows:
        cs = " ".join(f"{x}={v}" for x, v in sorted(r["config"].items()))
        print(f"{r['kernel']:<11} {cs + ' | ' + r['variant']:<70} {r['registers']:>4} {r['local']:>7} "
              f"{(r['static_shared'] + r['shared']) / 1024:>9.1f} {r['programs']:>2} {LIMIT[r['limit']]:<4} "
              f"{'-' if r['recorded'] is None else r['recorded']:>8}  {r['verdict']}")
    gone = resources.stale(rows, recorded, a.model) if not only and not force else []
    for key in gone:
        print(f"note: recorded but no longer compiled (a chooser changed; re-record): {key}")
    known = sum(r["local"] > 0 and resources.passed(r["verdict"]) for r in rows)
    print(f"{len(rows)} specializations, {len(bad)} failing, {known} with a known spill; "
          f"{sum(r['compile_s'] for r in rows):.1f} s compiling"
          + ("" if not bad else f"; reproduce: TRITON_INTERPRET=0 .venv/bin/python tools/sm90.py "
                                f"{shlex.join(sys.argv[1:])}"))
    return 1 if bad else 0


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
    pp.add_argument("--module", action="append", default=[], metavar="PATH_NAME=FILE",
                    help=f"a kernel file to compile instead of that path's ({', '.join(PDL_PATHS)}); repeatable")
    pp.add_argument("--only", default=None, metavar="NAMES",
                    help="comma-separated kernels to compile: gemv, small_mma, quantize (default: all)")
    pp.add_argument("--old-list", action="store_true", help="only 5f06600's six launches (to show what it missed)")
    fp = sub.add_parser("prefill", help="mmq_wgmma's Gluon kernel: registers, shared memory, its loop")
    add_shape_args(fp)
    fp.set_defaults(m=2048)
    fp.add_argument("--config", type=json.loads, default=None, help='fields over the chooser\'s, e.g. \'{"BN": 128}\'')
    fp.add_argument("--json", action="store_true", help="one JSON object instead of text")
    rp = sub.add_parser("resources", help="every chooser config: registers, spills, shared memory, programs per SM")
    rp.add_argument("--json", action="store_true", help="one JSON list instead of the table")
    rp.add_argument("--only", default=None, metavar="NAMES",
                    help=f"comma-separated paths to compile: {', '.join(RESOURCE_PATHS)} (default: all)")
    rp.add_argument("--config", action="append", default=[], metavar="PATH=JSON",
                    help='fields over a path\'s chooser, e.g. \'small_mma={"num_warps": 8}\'; repeatable')
    rp.add_argument("--model", action="store_true",
                    help="the GSM8K model's shapes too (about 520 compiles; the table records both)")
    rp.add_argument("--table", type=existing_file, default=None,
                    help="the recorded table (default: pq2verify/verified/resources-sm90.json)")
    rp.add_argument("--record", default=None, metavar="FILE",
                    help="write the compile's whole table (--model implied; measured occupancies kept) to FILE "
                         "instead of judging")
    a = ap.parse_args()
    if a.cmd == "resources":
        if a.table is None:
            from pq2verify import resources
            a.table = str(resources.RECORDED)
        return resources_main(a, rp)
    if a.cmd == "prefill":
        return prefill_report(a, ap)
    if a.cmd == "pdl":
        modules = {}
        for spec in a.module:
            name, eq, path = spec.partition("=")
            if not eq or name not in PDL_PATHS:
                ap.error(f"argument --module: expected PATH_NAME=FILE with PATH_NAME one of {', '.join(PDL_PATHS)}, "
                         f"got {spec!r}")
            if name in modules:
                ap.error(f"argument --module: {name} given twice")
            try:
                path = existing_file(path)
            except (argparse.ArgumentTypeError, ValueError) as e:
                ap.error(f"argument --module: {e}")
            modules[name] = load(path, name)
        only = None
        if a.only is not None:
            only = set(a.only.split(","))
            if not a.only or only - set(WEIGHTS):
                ap.error(f"argument --only: expected names from {', '.join(WEIGHTS)}, got {a.only!r}")
        rep = pdl_report(modules, old=a.old_list, only=only)
        if a.json:
            print(json.dumps(rep))
            return
        for r in rep:
            print(f"{r['kernel']}: {'OK' if not r['violations'] else 'VIOLATION'}; "
                  f"{len(r['reads_of_weights'])} weight reads before the wait; {len(r['uses'])} uses; "
                  f"compiled in {r['compile_s']:.2f} s")
            for v in r["violations"]:
                print("   ", v)
        bad = sum(bool(r["violations"]) for r in rep)
        print(f"{len(rep)} PDL launches, {bad} with violations; {sum(r['compile_s'] for r in rep):.1f} s compiling")
        return 1 if bad else 0
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
    sys.exit(main())
