"""Each path's matrix kernel as its run() launches it on sm_90: (config, compile_sm90 arguments,
options) for N x K weights in a layout, M rows of a dtype, from the path's own chooser."""
import triton

from kernels.format import layout_strides

from .compiler import load

SMALL_MMA_PTRS = dict(q_ptr="*i8", xs_ptr="*fp32", t_ptr="*i32", codes_ptr="*u8", scales_ptr="*fp16", out_ptr="*bf16",
            part_ptr="*fp32", count_ptr="*i32", dots_ptr="*i32")


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


def _masked_plane_launch(fn, c, n, k, dtype, layout, ints, consts):
    """gemv's and gemv_pair's shared launch facts: pointer types, the layout's strides and the
    chunk constexprs of config c, plus the kernel's own ints and consts."""
    g, per, gc, split = k // 128, c["groups_per_split"], c["GC"], c["SPLIT"]
    prepared, out = layout == "prepared", f"*{dtype}"
    ptrs = dict(a_ptr="*i32", xs_ptr="*fp32", t_ptr="*i32", codes_ptr="*i32" if prepared else "*u8",
                scales_ptr="*fp16", out_ptr=out, part_ptr="*fp32" if split > 1 else out, count_ptr="*i32",
                dots_ptr=out)
    ints = dict(out_sn=1, d_sn=0, d_sg=0, N=n, G=g, per=per, **layout_strides(n, k, layout), **ints)
    consts = dict(BN=c["BN"], GC=gc, LOG_GC=gc.bit_length() - 1, CHUNKS=-(-per // gc), DEPTH=c["DEPTH"], SPLIT=split,
                  MASKED=not (prepared and n % c["BN"] == 0 and per % gc == 0 and g % per == 0), PREPARED=prepared,
                  WRITE_DOTS=False, PDL=c["PDL"], INTERP=False, **consts)
    return c, (fn, ptrs, ints, consts, c["num_warps"], 1), {}


def gemv_launch(n, k, mod=None, dtype="bf16", layout="prepared", force=None):
    """(config, compile_sm90 arguments, options) of gemv's kernel on N x K weights in `layout`
    (M = 1), as gemv.run() launches it (PDL as its config says); force: fields over the
    chooser's."""
    if mod is None:
        from kernels import gemv as mod
    c = {**mod.config(n, k, 1, interpret=False), **(force or {})}
    return _masked_plane_launch(mod._gemv_kernel, c, n, k, dtype, layout, {}, dict(ACT_FIRST=c["ACT_FIRST"]))


def gemv_pair_launch(n, k, mod=None, dtype="bf16", layout="prepared", force=None):
    """(config, compile_sm90 arguments, options) of gemv_pair's kernel on N x K weights in
    `layout` (M = 2), as gemv_pair.run() launches it; force: fields over the chooser's."""
    if mod is None:
        from kernels import gemv_pair as mod
    c = {**mod.config(n, k, 2, interpret=False), **(force or {})}
    g = k // 128
    return _masked_plane_launch(mod._pair_kernel, c, n, k, dtype, layout,
                                dict(a_sm=k // 4, xs_sm=g, t_sm=g, out_sm=n, d_sm=0), {})


def quantize_launch(m, k, counters, dtype="bf16"):
    """The Q8 quantize kernel for x [M, K] of `dtype`, plane order, PDL, zeroing `counters`
    split-K counters (0: the consumer does not split; prepare.quantize_q8 then passes the sums)."""
    from kernels import prepare
    g = k // 128
    bu, warps = prepare._quantize_config(m * g, interpret=False)
    ptrs = dict(x_ptr=f"*{dtype}", q_ptr="*i8", s_ptr="*fp32", t_ptr="*i32", zero_ptr="*i32")
    ints = dict(U=m * g, G=g, stride_xm=k, Z=counters, stride_sg=0)
    consts = dict(BU=bu, PLANE=True, PDL=True, ZB=triton.next_power_of_2(counters) if counters else 0, BYG=False,
                  INTERP=False)
    return {}, (prepare._quantize_kernel, ptrs, ints, consts, warps, 1), {}


# --- the resource gate: every config the choosers return, compiled; pq2verify.sm90.resources judges

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
    "gemv_pair": lambda n, k, m, dtype, layout, cfg: gemv_pair_launch(n, k, None, dtype, layout, force=cfg),
    "mmq_wgmma": None,
}
