"""Compiling a Triton or Gluon kernel for sm_90 without a GPU (Triton's compiler for target
cuda:90, ints specialized as the JIT does: divisible by 16, or equal to 1), and reading the
result with Triton's bundled cuobjdump: SASS, registers, local and shared memory."""
import collections
import importlib
import importlib.util
import os
import re
import subprocess
import tempfile
import time

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.experimental.gluon._runtime import GluonASTSource

BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")


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


_COMPILED: dict = {}


def compile_cached(key, build):
    """build() (a compile) once per key in this process; Triton's own cache spans processes
    (tests/test_pdl_order.py's compiles of the same launches are hits here)."""
    if key not in _COMPILED:
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
