"""Tuning sweep for the M = 2..16 decode path (kernels.small_mma) on a GPU; not part of the suite:
it picks configs, the bench measures them. For each Bonsai PQ2 shape, every candidate config
(over the chooser: PDL, SWAP, tile, warps, stages, split-K target), and an older
kernel file (--old), timed at M = 4 and 16 as one CUDA graph of
calls on rotated weight copies, beside a streaming read of the same bytes; then the chained
257-projection step at M = 2, 4, 8, 16 with the chooser's configs, the per-shape best, and the
speed-of-light reads (plain and PDL). Writes JSON as it goes.

    git show REV:kernels/small_mma.py > old_small_mma.py
    python tools/tune/mma_sweep.py $OUT/mma_sweep.json [--old old_small_mma.py] [--shapes gate_up,down] [--m 4,16]
"""
import argparse
import json
import time

import torch
import triton

from kernels import small_mma, splitk
from pq2verify import inputs, registry
from pq2verify.bench import plan
from pq2verify.bench.probe import read_probe
from pq2verify.bench.sol import read_call
from pq2verify.bench.sweep import clocks, graph_time, pq2_shape_names, rotated_weights, stream_bw
from pq2verify.cli import existing_file, positive_ints

# variants over the chooser's config: (label, fields); "split:P" re-cuts split-K for ~P programs
VARIANTS = [("chooser", {}), ("no PDL", {"PDL": False}), ("UNROLL1", {"UNROLL": 1}), ("stages2", {"num_stages": 2}),
            ("stages4", {"num_stages": 4}), ("split:264", {}), ("split:528", {}), ("old split", {})]


def split_for(n, k, bn, progs):
    """(groups per split, splits) for about `progs` programs, a divisor of G if one is close
    (no dead groups: the unmasked kernel)."""
    groups, tiles_n, want = k // 128, triton.cdiv(n, bn), 1
    while tiles_n * want < progs and groups // (2 * want) >= 2:
        want *= 2
    per, split = splitk.split_groups(groups, want, 1)
    div = max(d for d in range(1, per + 1) if groups % d == 0)
    if 2 * div >= per:
        per, split = div, groups // div
    return per, split


def variant(n, k, m, fields, lab):
    c = {**small_mma.config(n, k, m), **fields}
    if "split:" in lab:
        c["groups_per_split"], c["SPLIT"] = split_for(n, k, c["BN"], int(lab.split("split:")[1]))
    if lab == "old split":   # the rule before the cap: ~1024 programs, no cap on partial bytes
        groups, want = k // 128, 1
        while triton.cdiv(n, c["BN"]) * want < 1024 and groups // (2 * want) >= 4:
            want *= 2
        c["groups_per_split"], c["SPLIT"] = splitk.split_groups(groups, want, 1)
    if c["groups_per_split"] % c["UNROLL"]:
        c["UNROLL"] = 1
    return c


def label(c):
    return ",".join(f"{a}={int(b) if type(b) is bool else b}" for a, b in c.items())


def mma(x, w, out, cfg):
    return lambda: small_mma.run(x, w, out=out, check=False, config=cfg)


def old_kernel(path):
    """Another version of kernels/small_mma.py (e.g. `git show REV:kernels/small_mma.py`), timed
    in the same process as the current one; None without --old."""
    if path is None:
        return None
    from pq2verify.sm90.compiler import load
    return load(path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dest", nargs="?", default="mma_sweep.json")
    ap.add_argument("--shapes", type=pq2_shape_names, default=None, help="PQ2 shape names (default: all six)")
    ap.add_argument("--m", type=positive_ints, default=[4, 16], help="Ms of the per-shape sweep (default 4,16)")
    ap.add_argument("--only-step", type=existing_file, default=None,
                    help="JSON with {'best': {shape: config}}: skip the sweep")
    ap.add_argument("--old", type=existing_file, default=None,
                    help="a previous kernels/small_mma.py to time beside the current one")
    args = ap.parse_args()
    t0 = time.time()
    torch.manual_seed(0)
    bw = stream_bw()
    res = {"bw": bw, "clocks_start": clocks(), "m": args.m, "shapes": {}, "step": {}}
    old = old_kernel(args.old)

    def save():
        with open(args.dest, "w") as f:
            json.dump(res, f, indent=1)
    shapes = {nm: sh for nm, sh in plan.step_shapes().items() if not sh.dense}
    sweep = {} if args.only_step else shapes
    if args.shapes:
        sweep = {nm: shapes[nm] for nm in args.shapes}
    best = {}
    for name, sh in sweep.items():
        n, k = sh.n, sh.k
        ws, nbytes = rotated_weights(n, k)
        copies = len(ws)
        res["shapes"][name] = {"n": n, "k": k, "bytes": nbytes, "rows": {}}
        for m in args.m:
            x = inputs.activations(m, k, seed=1, device="cuda")
            ref = registry.get("int_gemv").kernel()(x, ws[0]).float()
            outs = [torch.empty(m, n, dtype=x.dtype, device="cuda") for _ in ws]
            rows = res["shapes"][name]["rows"].setdefault(f"M={m}", {})
            y_chooser = y_old = None
            conts = [("old", None)] + [(lab, variant(n, k, m, f, lab)) for lab, f in VARIANTS]
            seen = set()
            for lab, cfg in conts:
                if lab == "old":
                    if old is None:
                        continue
                    run = lambda x, w, o: (lambda: old.run(x, w, out=o, check=False))  # noqa: E731
                else:
                    if cfg is None or label(cfg) in seen:
                        continue
                    seen.add(label(cfg))
                    run = lambda x, w, o, cfg=cfg: mma(x, w, o, cfg)  # noqa: E731
                try:
                    y = run(x, ws[0], outs[0])().clone()
                    err = float((y.float() - ref).norm() / ref.norm())
                    y2 = run(x, ws[0], torch.empty_like(outs[0]))()
                    t = graph_time([run(x, w, o) for w, o in zip(ws, outs)]) / copies
                except Exception as e:   # a config the compiler refuses: report, go on
                    rows[lab] = {"error": repr(e)[:300], "cfg": cfg}
                    print(f"{name:8s} M={m:2d} {lab:16s} ERROR {repr(e)[:200]}", flush=True)
                    continue
                if lab == "chooser":
                    y_chooser = y
                same = None if y_chooser is None or lab == "old" else bool(torch.equal(y, y_chooser))
                rows[lab] = {"cfg": cfg, "us": t * 1e6, "floor_frac": nbytes / t / bw, "relrms_vs_int_gemv": err,
                             "rerun_equal": bool(torch.equal(y, y2)), "bits_equal_chooser": same}
                if lab == "old":
                    y_old = y
                if lab == "chooser" and y_old is not None:
                    rows[lab]["bits_equal_old"] = bool(torch.equal(y, y_old))
                print(f"{name:8s} M={m:2d} {lab:16s} {t * 1e6:8.2f} us {nbytes / t / bw:6.1%} err {err:.1e} "
                      f"rerun= {rows[lab]['rerun_equal']} =chooser {same} =old {rows[lab].get('bits_equal_old', '')} "
                      f"{'' if cfg is None else label(cfg)} [{time.time() - t0:.0f}s]", flush=True)
            del outs
            ok = {lab: r for lab, r in rows.items() if r.get("cfg") and "us" in r}
            best.setdefault(name, {})[str(small_mma.m_bucket(m))] = min(ok.values(), key=lambda r: r["us"])["cfg"]
        flat = [w.flat.view(torch.int32) for w in ws]
        t = graph_time([read_probe(f)[0] for f in flat]) / copies
        res["shapes"][name]["read"] = {"us": t * 1e6, "floor_frac": nbytes / t / bw}
        print(f"{name:8s} read (SOL body)  {t * 1e6:8.2f} us {nbytes / t / bw:6.1%}", flush=True)
        save()
        del ws
        torch.cuda.empty_cache()
    if args.only_step:
        best = json.load(open(args.only_step))["best"]
    res["best"] = best
    print("best per shape and M bucket:", json.dumps(best), flush=True)

    order = plan.step_order()
    step_w = [inputs.ternary_weight(shapes[nm].n, shapes[nm].k, seed=1000 + i, device="cuda")
              for i, nm in enumerate(order)]
    total = sum(w.nbytes for w in step_w)

    def thunks(kind, m):
        out, prev = [], inputs.activations(m, 5120, seed=7, device="cuda")
        for nm, w in zip(order, step_w):
            o = torch.empty(m, w.n, dtype=torch.bfloat16, device="cuda")
            xin = prev.reshape(-1)[:m * w.k].view(m, w.k)
            if kind == "chooser":
                out.append(lambda x=xin, w=w, o=o: small_mma.run(x, w, out=o, check=False))
            elif kind == "old":
                out.append(lambda x=xin, w=w, o=o: old.run(x, w, out=o, check=False))
            elif kind == "best" and nm in best:
                out.append(mma(xin, w, o, best[nm][str(small_mma.m_bucket(m))]))
            elif kind.startswith("read"):
                out.append(read_call(w.flat.view(torch.int32), kind == "read_pdl")[0])
            else:
                raise ValueError(f"{kind}: no config for {nm}")
            prev = o
        return out
    for m in (2, 4, 8, 16):
        for kind in ("old", "chooser", "best", "read", "read_pdl"):
            if kind == "old" and old is None:
                continue
            if kind.startswith("read") and m != 16:
                continue
            if kind == "best" and set(best) != set(shapes):
                continue
            th = thunks(kind, m)
            t = graph_time(th, reps=5)
            res["step"][f"{kind} M={m}"] = {"ms": t * 1e3, "floor_frac": total / t / bw}
            print(f"step M={m:2d} {kind:10s} {t * 1e3:7.3f} ms  {total / t / bw:6.1%} of floor "
                  f"({total / bw * 1e3:.3f} ms)  [{time.time() - t0:.0f}s]", flush=True)
            del th
            save()
    res["step_bytes"] = total
    res["clocks_end"] = clocks()
    save()
    print("clocks", res["clocks_end"])


if __name__ == "__main__":
    main()
