"""The resource gate's launches: every config the choosers return, once per compiled
specialization, compiled; pq2verify.sm90.resources judges them."""
import importlib

from . import compiler
from .launches import RESOURCE_PATHS
from .shapes import run_shapes

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
                                     compiler.wgmma_compile(n, k, m, f, dt)[1])
                            warps = c["num_warps"]
                        else:
                            c, args, opts = build(n, k, m, dtype, layout, cfg)
                            full = compiler.specialization(*args, opts)
                            spec = (name, dtype) + full[2:]    # not the module: a planted file keeps its keys
                            variant = _variant(args, c)
                            thunk = (lambda args=args, opts=opts: compiler.compile_sm90(*args, **opts)[0])
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
    memory, programs per SM and the binding limit (resources.occupancy), the compile's
    seconds, and with `recorded` given the recorded value and the verdict."""
    from . import resources
    rows = []
    for e in resource_launches(force, only, model):
        kern, dt = compiler.compile_cached(e["spec"], e["build"])
        use = compiler.resource_usage(kern)   # looked up here: a test plants a heavier one
        programs, limit = resources.occupancy(use["registers"], kern.metadata.shared, e["num_warps"],
                                              use["static_shared"])
        rows.append(dict(kernel=e["kernel"], config=e["config"], variant=e["variant"], key=e["key"], uses=e["uses"],
                         num_warps=e["num_warps"], **use, shared=kern.metadata.shared, programs=programs, limit=limit,
                         compile_s=round(dt, 3)))
    return rows if recorded is None else resources.gate(rows, recorded)
