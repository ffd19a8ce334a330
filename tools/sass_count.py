"""Instruction counts of a decode kernel's sm_90 machine code, compiled on this machine (no GPU:
Triton ships ptxas and nvdisasm): per kernel variant the static counts of the whole kernel and of
its main loop (the largest backward branch's body), and the loop's instructions per weight byte.
A proxy for the GPU's issue budget (~7.3 instructions a weight byte at 4.6 TB/s on 132 SMs at
1.98 GHz), not a timing.

    python tools/sass_count.py            # gemv at M = 1, gemv_rows at M = 2, 4, 8, 16
"""
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

PTR = {"a_ptr": "*i32", "xs_ptr": "*fp32", "t_ptr": "*i32", "codes_ptr": "*i32", "scales_ptr": "*fp16",
       "out_ptr": "*bf16", "part_ptr": "*fp32", "count_ptr": "*i32", "dots_ptr": "*bf16"}


def compile_sass(fn, constexprs: dict, num_warps: int) -> str:
    sig = {a: ("constexpr" if a in constexprs else PTR.get(a, "i32")) for a in fn.arg_names}
    src = ASTSource(fn, sig, constexprs={(fn.arg_names.index(k),): v for k, v in constexprs.items()})
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps, "num_stages": 1})
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(k.asm["cubin"])
        f.flush()
        return subprocess.run([_tool("nvdisasm"), "-c", f.name], capture_output=True, text=True, check=True).stdout


def _tool(name):
    return str(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name)


def loop_body(sass: str) -> list[str]:
    """Instructions of the longest backward-branch loop ([label, branch] span)."""
    lines = [ln for ln in sass.splitlines() if re.search(r"/\*[0-9a-f]{4}\*/", ln)]
    addr = [int(re.search(r"/\*([0-9a-f]{4})\*/", ln).group(1), 16) for ln in lines]
    best = []
    for i, ln in enumerate(lines):
        t = re.search(r"\.L_x_(\d+)", ln)
        if "BRA" not in ln or not t:
            continue
        label = f".L_x_{t.group(1)}:"
        starts = [j for j, l0 in enumerate(sass.splitlines()) if l0.strip().startswith(label)]
        if not starts:
            continue
        # the label's first instruction: the next instruction line after it in the listing
        all_lines = sass.splitlines()
        j = starts[0] + 1
        while j < len(all_lines) and not re.search(r"/\*[0-9a-f]{4}\*/", all_lines[j]):
            j += 1
        if j >= len(all_lines):
            continue
        a0 = int(re.search(r"/\*([0-9a-f]{4})\*/", all_lines[j]).group(1), 16)
        if a0 < addr[i] and (addr[i] - a0) > (len(best) * 16):
            best = [l1 for l1, a in zip(lines, addr) if a0 <= a <= addr[i]]
    return best


def ops(lines):
    out = {}
    for ln in lines:
        m = re.search(r"\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)", ln)
        if m:
            op = m.group(1).split(".")[0]
            out[op] = out.get(op, 0) + 1
    return out


def report(name, fn, constexprs, warps, bytes_per_trip):
    sass = compile_sass(fn, constexprs, warps)
    body = loop_body(sass)
    o = ops(body)
    n = sum(v for k, v in o.items() if k != "NOP")
    threads = 32 * warps
    print(f"{name:34s} loop {n:4d} instr/thread/trip, {o.get('IDP', 0):3d} DP4A, {o.get('LDG', 0):2d} LDG, "
          f"{o.get('LDS', 0) + o.get('STS', 0):2d} LDS/STS; {n * threads / bytes_per_trip:5.2f} instr per weight byte")


def main() -> int:
    from kernels import gemv, gemv_rows
    base = dict(MASKED=False, PREPARED=True, WRITE_DOTS=False, INTERP=False, SPLIT=1, CHUNKS=8)
    for bn, gc, w in ((64, 8, 8), (32, 8, 4)):
        report(f"gemv M=1 BN{bn} GC{gc} w{w}", gemv._gemv_kernel,
               dict(base, BN=bn, GC=gc, LOG_GC=gc.bit_length() - 1, PDL=False), w, bn * gc * 32)
    for m in (2, 4, 8, 16):
        c = gemv_rows.config(5120, 5120, m, False)
        report(f"gemv_rows M={m} BN{c['BN']} GC{c['GC']} w{c['num_warps']}", gemv_rows._rows_kernel,
               dict(base, CHAIN=True, BM=c["BM"], BN=c["BN"], GC=c["GC"], LOG_GC=c["GC"].bit_length() - 1),
               c["num_warps"], c["BN"] * c["GC"] * 32)
    return 0


if __name__ == "__main__":
    sys.exit(main())
