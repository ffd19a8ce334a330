"""Tuning sweep for the M = 1 decode path on a GPU (not part of the suite: it picks configs, the
bench measures them). For each Bonsai shape: every candidate config of kernels.gemv (PDL on and
off), the legacy/tuned M = 1 paths and a pure streaming read of the same bytes, each as one CUDA
graph of calls on rotated weight copies; then a chained 257-projection step per contestant.
Prints tables and writes JSON to argv[1] (default sweep.json).

    python tools/tune/decode_sweep.py $OUT/sweep.json
"""
import json
import sys

import torch

from kernels import gemv
from pq2verify import inputs, registry
from pq2verify.bench import plan
from pq2verify.bench.probe import read_probe
from pq2verify.bench.sol import read_call
from pq2verify.bench.sweep import clocks, graph_time, rotated_weights, stream_bw

TILES = [(32, 8, 4), (64, 8, 8), (16, 16, 4), (64, 16, 8)]


def candidates(n, k):
    """(BN, GC, num_warps) x SPLIT around ~1000-2000 programs, every split non-empty."""
    groups, out = k // 128, []
    for bn, gc, w in TILES:
        tiles = -(-n // bn)
        base = 1
        while tiles * base < 1024 and groups // (base * 2) >= 2 * gc:
            base *= 2
        for split in sorted({base, base * 2}):
            per = -(-groups // split)
            if -(-groups // per) == split and per >= gc:
                out.append(dict(BN=bn, GC=gc, groups_per_split=per, SPLIT=split, num_warps=w))
    return out


def run_path(name, x, w, out, config=None):
    if name.startswith("gemv"):
        return lambda: gemv.run(x, w, out=out, check=False, config=config)
    f = registry.get(name).kernel()
    return lambda: f(x, w, out=out, check=False)


def main():
    dest = sys.argv[1] if len(sys.argv) > 1 else "sweep.json"
    torch.manual_seed(0)
    bw = stream_bw()
    res = {"bw": bw, "clocks_start": clocks(), "shapes": {}, "step": {}}
    shapes = {nm: sh for nm, sh in plan.step_shapes().items() if not sh.dense}
    given = json.load(open(sys.argv[2])) if len(sys.argv) > 2 else None   # {"best": ..., "best_split1": ...}
    for name, sh in ({} if given else shapes).items():
        n, k = sh.n, sh.k
        ws, nbytes = rotated_weights(n, k)
        copies = len(ws)
        x = inputs.activations(1, k, seed=1, device="cuda")
        ref = registry.get("int_gemv").kernel()(x, ws[0])
        rows = {}
        outs = [torch.empty(1, n, dtype=x.dtype, device="cuda") for _ in ws]
        cands = [("gemv:" + ",".join(f"{a}={b}" for a, b in c.items()), c) for c in candidates(n, k)]
        for label, cfg in cands + [("single", None), ("int_gemv", None)]:
            try:
                y = run_path(label, x, ws[0], outs[0], cfg)()
                err = float((y.float() - ref.float()).norm() / ref.float().norm())
                t = graph_time([run_path(label, x, w, o, cfg) for w, o in zip(ws, outs)]) / copies
            except Exception as e:   # a config the compiler refuses: report, go on
                rows[label] = {"error": repr(e)[:200]}
                print(f"{name:8s} {label:34s} ERROR {repr(e)[:120]}", flush=True)
                continue
            rows[label] = {"us": t * 1e6, "gbs": nbytes / t / 1e9, "floor_frac": nbytes / t / bw, "relrms_vs_int_gemv": err}
            print(f"{name:8s} {label:34s} {t * 1e6:8.2f} us {nbytes / t / 1e9:7.0f} GB/s {nbytes / t / bw:6.1%}  err {err:.1e}", flush=True)
        flat = [w.flat.view(torch.int32) for w in ws]
        t = graph_time([read_probe(f)[0] for f in flat]) / copies
        rows["read"] = {"us": t * 1e6, "gbs": nbytes / t / 1e9, "floor_frac": nbytes / t / bw}
        print(f"{name:8s} {'read (SOL body)':34s} {t * 1e6:8.2f} us {nbytes / t / 1e9:7.0f} GB/s {nbytes / t / bw:6.1%}", flush=True)
        res["shapes"][name] = {"n": n, "k": k, "bytes": nbytes, "rows": rows}
        del ws, outs
        torch.cuda.empty_cache()
    # chained step: 257 projections in model order, each its own weight, x_next = out_prev's first K
    order = [nm for nm in plan.step_order() if nm in shapes]
    step_w = []
    for i, nm in enumerate(order):
        sh = shapes[nm]
        step_w.append(inputs.ternary_weight(sh.n, sh.k, seed=1000 + i, device="cuda"))
    total = sum(w.nbytes for w in step_w)
    best, best1 = {}, {}
    for nm, d in res["shapes"].items():
        ok = {l: r for l, r in d["rows"].items() if l.startswith("gemv:") and "us" in r}
        best[nm] = min(ok, key=lambda l: ok[l]["us"]) if ok else None
        ok1 = {l: r for l, r in ok.items() if "SPLIT=1," in l}
        best1[nm] = min(ok1, key=lambda l: ok1[l]["us"]) if ok1 else best[nm]
    if given:
        best, best1 = given["best"], given["best_split1"]
    res["best"], res["best_split1"] = best, best1
    print("best per shape:", best, flush=True)

    def cfg_of(label):
        return dict((a, int(b)) for a, b in (kv.split("=") for kv in label[5:].split(",")))

    def step_thunks(kind, pdl=True):
        outs, thunks = [], []
        x0 = inputs.activations(1, 5120, seed=7, device="cuda")
        prev = x0
        for nm, w in zip(order, step_w):
            o = torch.empty(1, w.n, dtype=torch.bfloat16, device="cuda")
            xin = prev.reshape(-1)[:w.k].view(1, w.k)
            if kind == "gemv":
                c = dict(cfg_of(best[nm]), PDL=pdl) if best[nm] else None
                thunks.append(run_path("gemv", xin, w, o, c))
            elif kind in ("gemv1", "gemv1 noq"):
                c = dict(cfg_of(best1[nm]), PDL=pdl)
                if kind == "gemv1":
                    thunks.append(run_path("gemv", xin, w, o, c))
                else:   # the GEMV kernel alone on activations quantized once, outside the graph
                    from kernels import prepare
                    qq = prepare.quantize_q8(xin.clone().normal_(), order="plane")
                    cnt = torch.zeros(-(-w.n // c["BN"]), dtype=torch.int32, device="cuda")
                    thunks.append(lambda qq=qq, w=w, o=o, c=c: gemv.launch(*qq, w, o, c, pdl=pdl, count=cnt))
            elif kind == "read":
                thunks.append(read_call(w.flat.view(torch.int32), pdl)[0])
            else:
                thunks.append(run_path(kind, xin, w, o))
            outs.append(o)
            prev = o
        return thunks, outs

    for kind, pdl in [("gemv", True), ("gemv", False), ("gemv1", True), ("gemv1 noq", True), ("gemv1 noq", False),
                      ("single", True), ("int_gemv", True), ("read", True), ("read", False)]:
        label = f"{kind}{'' if pdl else ' (no PDL)'}"
        thunks, outs = step_thunks(kind, pdl)
        t = graph_time(thunks, reps=5)
        res["step"][label] = {"ms": t * 1e3, "floor_frac": total / t / bw}
        print(f"step M=1 {label:20s} {t * 1e3:7.3f} ms  {total / t / bw:6.1%} of floor ({total / bw * 1e3:.3f} ms)", flush=True)
        del thunks, outs
    res["step_bytes"] = total
    res["clocks_end"] = clocks()
    print("clocks", res["clocks_end"])
    with open(dest, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
