"""mmq_wgmma's program order at large M: config variants timed in one process, alternating rounds.

Per shape and M: each variant's calls (config fields forced over the chooser's) on W weight
copies are one CUDA graph; rounds alternate the variants (order rotated each round); the last
round's outputs are compared bit for bit with the first variant's. cuBLAS BF16 on the decoded
matrix is timed beside them ("cublas"). Ratios per round against the first variant: median
[min-max]. JSON written after every row.

    python prefill_order_ab.py OUT.json --m 4096,8192 --shapes gate_up,down \
        --variants '{"g0": {"GROUP_M": 0}, "g8": {"GROUP_M": 8}}' --rounds 5 --budget-s 150
"""
import argparse
import functools
import json
import statistics
import time

import torch

from kernels import mmq_wgmma
from pq2verify import cases, inputs
from pq2verify.bench.gate import decode_dense
from pq2verify.bench.sweep import capture, clocks, replay_s

ap = argparse.ArgumentParser()
ap.add_argument("out")
ap.add_argument("--m", default="8192")
ap.add_argument("--shapes", default="gate_up,down,in_proj,qkv,out,lm_head")
ap.add_argument("--variants", required=True)
ap.add_argument("--rounds", type=int, default=5)
ap.add_argument("--copies", type=int, default=2)
ap.add_argument("--budget-s", type=float, default=1e9)
a = ap.parse_args()
variants = json.loads(a.variants)
shapes = {s: (n, k) for s, n, k in cases.SHAPES["bonsai27b"]["pq2"]}
t0 = time.time()
res = {"clocks_start": clocks(), "gpu": torch.cuda.get_device_name(), "variants": variants, "rows": []}
for m in [int(v) for v in a.m.split(",")]:
    for s in a.shapes.split(","):
        if time.time() - t0 > a.budget_s:
            print(f"budget: stop before {s} M={m}", flush=True)
            break
        n, k = shapes[s]
        x = inputs.activations(m, k, seed=1, device="cuda")
        ws = [inputs.ternary_weight(n, k, seed=10 + i, device="cuda") for i in range(a.copies)]
        timers, outs = {}, {}
        for name, f in variants.items():
            y = torch.empty(m, n, dtype=x.dtype, device="cuda")
            outs[name] = y
            timers[name] = capture([functools.partial(mmq_wgmma.run, x, w, out=y, check=False, config=f) for w in ws])
        dense = [decode_dense(w, x.dtype) for w in ws[:1]] * a.copies   # one copy: cuBLAS is compute-bound here
        yb = torch.empty(m, n, dtype=x.dtype, device="cuda")
        timers["cublas"] = capture([functools.partial(torch.mm, x, d.t(), out=yb) for d in dense])
        names = list(timers)
        est = replay_s(timers[names[0]], 1)
        reps = max(1, int(0.03 / max(est, 1e-6)))
        times = {v: [] for v in names}
        for r in range(a.rounds):
            for v in names[r % len(names):] + names[:r % len(names)]:
                times[v].append(replay_s(timers[v], reps) / a.copies * 1e6)
        first = names[0]
        row = {"shape": s, "n": n, "k": k, "m": m, "reps": reps, "clocks": clocks(),
               "us": {v: statistics.median(t) for v, t in times.items()}, "rounds": times, "bits_equal_first": {}}
        for v in names:
            rat = sorted(tf / tv for tf, tv in zip(times[first], times[v]))
            row.setdefault("speed_vs_first", {})[v] = [statistics.median(rat), rat[0], rat[-1]]
            if v != "cublas":
                row["bits_equal_first"][v] = bool(torch.equal(outs[v].view(torch.int16), outs[first].view(torch.int16)))
        res["rows"].append(row)
        print(f"{s:8s} M={m:5d} " + " | ".join(
            f"{v} {row['us'][v]:9.1f} us {row['speed_vs_first'][v][0]:.3f}x [{row['speed_vs_first'][v][1]:.3f}-"
            f"{row['speed_vs_first'][v][2]:.3f}]" + ("" if v == "cublas" else f" ={int(row['bits_equal_first'][v])}")
            for v in names) + f" | {row['clocks']}", flush=True)
        json.dump(res, open(a.out, "w"), indent=1)
        for t in timers.values():
            t.graph.reset()
        del timers, outs, dense, ws, x
        torch.cuda.empty_cache()
res["clocks_end"] = clocks()
json.dump(res, open(a.out, "w"), indent=1)
