"""Instructions in small_mma's main loop on sm_90, without a GPU: compile its kernel with Triton
for target cuda:90 (ints specialized as the JIT does: divisible by 16, or equal to 1), dump the
SASS with Triton's bundled cuobjdump, and print each loop's instruction histogram and the
warp-instructions per weight byte (a decode call's issue budget at 4.6 TB/s is ~0.23).

    python tools/sass_loop.py --n 34816 --k 5120 --m 16 [--module path/to/old_small_mma.py] [--json]

It compiles, so run it with TRITON_INTERPRET unset (the interpreter's kernels do not compile).
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

BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
PTRS = dict(q_ptr="*i8", xs_ptr="*fp32", t_ptr="*i32", codes_ptr="*u8", scales_ptr="*fp16", out_ptr="*bf16",
            part_ptr="*fp32", count_ptr="*i32", dots_ptr="*i32")


def load(path):
    if path is None:
        from kernels import small_mma
        return small_mma
    spec = importlib.util.spec_from_file_location("small_mma_under_test", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def compile_loop(mod, n, k, m, force=None):
    cfg = {**mod.config(n, k, m, interpret=False), **(force or {})}
    g = k // 128
    ints = dict(q_sm=k, xs_sm=g, t_sm=g, out_sm=n, out_sn=1, d_sm=0, d_sn=0, d_sg=0, M=m, N=n, G=g,
                code_row=g * 32, code_group=32, code_off=0, scale_row=g, scale_group=1, scale_off=0)
    want = dict(BM=16, BN=cfg["BN"], PER=cfg["groups_per_split"], SPLIT=cfg["SPLIT"], SWAP=cfg["SWAP"],
                UNROLL=cfg["UNROLL"], PREPARED=True, WRITE_DOTS=False, INTERP=False,
                MASKED=not (n % cfg["BN"] == 0 and g % cfg["groups_per_split"] == 0), PDL=cfg.get("PDL", False))
    fn = mod._small_mma_kernel
    sig, consts, attrs = {}, {}, {}
    for i, a in enumerate(fn.arg_names):
        if a in PTRS:
            sig[a], attrs[(i,)] = PTRS[a], [["tt.divisibility", 16]]
        elif a in ints and ints[a] == 1:
            sig[a], consts[a] = "constexpr", 1
        elif a in ints:
            sig[a] = "i32"
            if ints[a] % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            sig[a], consts[a] = "constexpr", want[a]
    opts = dict(num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    if cfg.get("maxnreg"):
        opts["maxnreg"] = cfg["maxnreg"]
    kern = triton.compile(ASTSource(fn, sig, consts, attrs), target=GPUTarget("cuda", 90, 32), options=opts)
    with tempfile.TemporaryDirectory() as d:
        cubin = os.path.join(d, "small_mma.cubin")
        with open(cubin, "wb") as f:
            f.write(kern.asm["cubin"])
        dump = [os.path.join(BIN, "cuobjdump"), cubin]
        sass = subprocess.run(dump[:1] + ["-sass"] + dump[1:], capture_output=True, text=True, check=True).stdout
        usage = subprocess.run(dump[:1] + ["-res-usage"] + dump[1:], capture_output=True, text=True, check=True).stdout
    return cfg, sass, re.search(r"REG:(\d+)", usage).group(1)


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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=34816)
    ap.add_argument("--k", type=int, default=5120)
    ap.add_argument("--m", type=int, default=16)
    ap.add_argument("--module", default=None, help="a small_mma.py to compile instead of kernels/small_mma.py")
    ap.add_argument("--json", action="store_true", help="one JSON object instead of text")
    ap.add_argument("--config", type=json.loads, default=None, help='fields over the chooser\'s, e.g. \'{"UNROLL": 2}\'')
    a = ap.parse_args()
    cfg, sass, regs = compile_loop(load(a.module), a.n, a.k, a.m, a.config)
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
        print(f"loop {lp['first']:#x}-{lp['last']:#x}: {lp['instructions']} instructions a trip ({cfg['UNROLL']} groups) and thread, "
              f"{lp['warp_instructions_per_byte']:.3f} warp-instructions per weight byte; "
              f"{dict(list(lp['ops'].items())[:12])}")


if __name__ == "__main__":
    main()
