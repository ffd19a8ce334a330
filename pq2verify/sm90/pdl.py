"""The PDL order check's launches: every kernel launched with programmatic dependent launch
(gemv, gemv_pair, small_mma, the quantize kernel), once per compiled specialization, for every shape and M
the bench, the GPU check and the GSM8K model run; pq2verify.sm90.ptx judges each one's PTX."""
from .compiler import compile_sm90, load, specialization
from .launches import gemv_launch, gemv_pair_launch, quantize_launch, small_mma_launch
from .shapes import run_shapes

# Pointers that hold weights: constants a PDL kernel may read before its wait.
WEIGHTS = {"gemv": {"codes_ptr", "scales_ptr"}, "gemv_pair": {"codes_ptr", "scales_ptr"}, "small_mma": {"codes_ptr", "scales_ptr"}, "quantize": set()}
# The PDL-launching paths: name -> (N, K, M, dtype, layout, module) -> (config, compile args, options)
PDL_PATHS = {
    "gemv": lambda n, k, m, dtype, layout, mod: gemv_launch(n, k, mod, dtype, layout),
    "gemv_pair": lambda n, k, m, dtype, layout, mod: gemv_pair_launch(n, k, mod, dtype, layout),
    "small_mma": lambda n, k, m, dtype, layout, mod: small_mma_launch(mod or load(None), n, k, m, None, dtype, layout),
}
# commit 5f06600's list (tests/test_pdl_order.py shows what it misses): (path, N, K, M)
OLD_PDL_LIST = [("gemv", 34816, 5120, 1), ("gemv", 5120, 17408, 1), ("small_mma", 34816, 5120, 16),
                ("small_mma", 5120, 17408, 4)]


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
    from . import ptx
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
