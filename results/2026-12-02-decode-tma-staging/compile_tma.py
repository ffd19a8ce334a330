"""Compile gemv_tma's Gluon kernel for sm_90 on the CPU: registers, smem, errors."""
import sys, torch, triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from triton.runtime.jit import mangle_type
from kernels import gemv_tma as gt
from pq2verify.sm90.compiler import resource_usage, sass_and_registers, loops

def comp(n, k, force=None, split=None):
    cfg = gt._resolve(n, k, False, force)
    g = k // 128
    codes = torch.zeros(n * g * 8, dtype=torch.int32)
    scales = torch.zeros(n * g, dtype=torch.float16)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    c_desc = gt._desc(codes.view(n, g, 8), (cfg["BN"], cfg["GC"], 8), 32)
    s_desc = gt._desc(scales.view(n, g), (cfg["BN"], cfg["GC"]), 16)
    q = torch.zeros(1, k, dtype=torch.int8); xs = torch.zeros(1, g); t = torch.zeros(1, g, dtype=torch.int32)
    a_desc, x_desc, t_desc = gt.act_descs(q, xs, t, cfg["GC"])
    fn = gt._kernel
    descs = dict(c_desc=c_desc, s_desc=s_desc, a_desc=a_desc, x_desc=x_desc, t_desc=t_desc)
    sig = {a: mangle_type(d) for a, d in descs.items()}
    sig.update(out_ptr="*bf16", out_sn="i32", part_ptr="*fp32", count_ptr="*i32", dots_ptr="*bf16", d_sn="i32", d_sg="i32",
               N="i32", G="i32", per="i32")
    gc = cfg["GC"]
    cx = dict(BN=cfg["BN"], GC=gc, LOG_GC=gc.bit_length() - 1, CHUNKS=triton.cdiv(cfg["groups_per_split"], gc),
              S=cfg["num_stages"], SPLIT=cfg["SPLIT"], WRITE_DOTS=False, PDL=True, num_warps=cfg["num_warps"])
    sig.update({a: "constexpr" for a in cx})
    sig["out_sn"] = "constexpr"; cx["out_sn"] = 1
    attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a in ("out_ptr", "part_ptr", "count_ptr", "dots_ptr")}
    kern = triton.compile(GluonASTSource(fn, sig, cx, attrs), target=GPUTarget("cuda", 90, 32),
                          options=dict(num_warps=cfg["num_warps"], num_stages=1))
    return cfg, kern

if __name__ == "__main__":
    for n, k in [(34816, 5120), (5120, 17408), (5120, 6144), (14336, 5120)]:
        cfg, kern = comp(n, k)
        sass, regs = sass_and_registers(kern)
        print(n, k, cfg, resource_usage(kern), "smem", kern.metadata.shared)
        if "-v" in sys.argv:
            for a, b, c in loops(sass):
                print("  loop", sum(c.values()), dict(c.most_common(12)))
