"""Prefill timing on a GPU (not part of the suite): per Bonsai shape at M = 512 and 2048, mmq
(legacy), a prefill path (--path: its chooser's config and forced configs) and cuBLAS BF16 on the
same shape, each as one CUDA graph of calls on rotated weight copies, paired in one process;
int8 Top/s, the fraction of the dense int8 peak and the ratio to cuBLAS. Each path's bits are
compared with mmq's. Writes JSON as it goes.

    python tools/tune/prefill_sweep.py $OUT/prefill.json [--m 512,2048] [--path mmq_wgmma] [--variants '[{"BM": 64}]']
"""
import argparse
import json
import time

import torch

from kernels import cublas, mmq
from pq2verify import inputs, registry
from pq2verify.bench import plan
from pq2verify.bench.plan import INT8_PEAK_TOPS
from pq2verify.bench.sweep import clocks, graph_time, pq2_shape_names
from pq2verify.cli import positive_ints


def prefill_path(name: str):
    """argparse type: a registry path serving M > 16 on PQ2 weights (its module)."""
    try:
        p = registry.get(name)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if p.weight != "pq2" or not p.serves(512):
        raise argparse.ArgumentTypeError(f"{name}: not a prefill path of PQ2 weights (serves M {p.m_range()})")
    return p


def variants(spec: str) -> list:
    """argparse type: a JSON list of config objects (checked field by field against --path's
    rules, pq2verify.tiles, once the path is known)."""
    try:
        v = json.loads(spec)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not JSON: {e}") from None
    if not isinstance(v, list) or not all(isinstance(c, dict) for c in v):
        raise argparse.ArgumentTypeError(f"expected a JSON list of objects, got {spec!r}")
    return v


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dest", nargs="?", default="prefill.json")
    ap.add_argument("--m", type=positive_ints, default=[512, 2048])
    ap.add_argument("--shapes", type=pq2_shape_names, default=None, help="PQ2 shape names (default: all six)")
    ap.add_argument("--path", type=prefill_path, default=registry.get("mmq_wgmma"), help="the prefill path to time")
    ap.add_argument("--variants", type=variants, default=[],
                    help="--path config fields to force, a JSON list of objects")
    args = ap.parse_args()
    for c in args.variants:
        try:
            args.path.fold(4096, 4096, 2048, config=c)
        except ValueError as e:
            ap.error(f"--variants: {e}")
    run = args.path.kernel()
    t0 = time.time()
    shapes = {nm: sh for nm, sh in plan.step_shapes().items() if not sh.dense}
    if args.shapes:
        shapes = {nm: shapes[nm] for nm in args.shapes}
    res = {"clocks_start": clocks(), "rows": []}
    for name, sh in shapes.items():
        n, k = sh.n, sh.k
        copies = 2
        layout = args.path.layouts[-1]
        ws = [inputs.ternary_weight(n, k, seed=i, device="cuda", layout=layout) for i in range(copies)]
        ds = [inputs.dense_weight(n, k, seed=i, device="cuda") for i in range(copies)]
        for m in args.m:
            x = inputs.activations(m, k, seed=1, device="cuda")
            outs = [torch.empty(m, n, dtype=x.dtype, device="cuda") for _ in ws]
            ref = mmq.run(x, ws[0], check=False).clone()
            conts = [("mmq", lambda w, o: (lambda: mmq.run(x, w, out=o, check=False)), True),
                     (args.path.name, lambda w, o: (lambda: run(x, w, out=o, check=False)), True)]
            for v in args.variants:
                conts.append((f"{args.path.name} {json.dumps(v)}",
                              lambda w, o, v=v: (lambda: run(x, w, out=o, check=False, config=v)), True))
            conts.append(("cublas", lambda w, o: (lambda: cublas.run(x, w, out=o, check=False)), False))
            times = {}
            for lab, make, pq2 in conts:
                wl = ws if pq2 else ds
                try:
                    y = make(wl[0], outs[0])().clone()
                    t = graph_time([make(w, o) for w, o in zip(wl, outs)], reps=5) / copies
                except Exception as e:   # a config the compiler refuses: report, go on
                    print(f"{name:8s} M={m:5d} {lab:40s} ERROR {repr(e)[:200]}", flush=True)
                    continue
                times[lab] = t
                row = {"shape": name, "n": n, "k": k, "m": m, "path": lab, "us": t * 1e6,
                       "tops": 2 * m * n * k / t / 1e12, "peak": 2 * m * n * k / t / 1e12 / INT8_PEAK_TOPS,
                       "bits_equal_mmq": bool(torch.equal(y, ref)) if pq2 else None}
                res["rows"].append(row)
            base = times.get("cublas")
            for row in res["rows"]:
                if row["shape"] == name and row["m"] == m and base:
                    row["x_cublas"] = base / (row["us"] / 1e6)
                    print(f"{name:8s} M={m:5d} {row['path']:40s} {row['us']:9.1f} us {row['tops']:7.1f} Top/s "
                          f"{row['peak']:6.1%} "
                          f"{row['x_cublas']:5.2f}x cuBLAS  bits=mmq {row['bits_equal_mmq']}  [{time.time() - t0:.0f}s]",
                          flush=True)
            del outs
        del ws, ds
        torch.cuda.empty_cache()
        with open(args.dest, "w") as f:
            json.dump(res, f, indent=1)
    res["clocks_end"] = clocks()
    with open(args.dest, "w") as f:
        json.dump(res, f, indent=1)
    print("clocks", res["clocks_end"])


if __name__ == "__main__":
    main()
